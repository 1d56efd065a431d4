package ai.enterprise.sdk;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;
import java.util.Map;

/** 409 (idempotency_conflict, idempotency_in_progress, …). */
public class ConflictException extends EnterpriseAIException {
  private static final long serialVersionUID = 1L;

  public ConflictException(
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
