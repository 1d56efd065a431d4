package ai.enterprise.sdk;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;
import java.util.Map;

/** 502 and 504: the tool failed or timed out. */
public class ToolException extends EnterpriseAIException {
  private static final long serialVersionUID = 1L;

  public ToolException(
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
