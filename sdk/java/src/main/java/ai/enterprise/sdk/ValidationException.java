package ai.enterprise.sdk;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;
import java.util.Map;

/** 400, 413, 415, 422: the request was refused as it is. */
public class ValidationException extends EnterpriseAIException {
  private static final long serialVersionUID = 1L;

  public ValidationException(
      int status,
      String code,
      String message,
      Map<String, String> messageI18n,
      String requestId,
      String decisionId,
      String invocationId,
      JsonNode details,
      Duration retryAfter,
      Throwable cause) {
    super(status, code, message, messageI18n, requestId, decisionId, invocationId, details, retryAfter, cause);
  }
}
