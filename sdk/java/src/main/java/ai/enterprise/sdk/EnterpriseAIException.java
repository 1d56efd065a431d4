package ai.enterprise.sdk;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;
import java.util.Map;
import java.util.Optional;

/**
 * Every error: the gateway's error envelope, or a failure of the client itself
 * ({@link #status()} 0). One runtime hierarchy: catch this class, or a subclass for a
 * family of statuses.
 */
public class EnterpriseAIException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final int status;
  private final String code;
  private final Map<String, String> messageI18n;
  private final String requestId;
  private final String decisionId;
  private final String invocationId;
  private final transient JsonNode details;
  private final Duration retryAfter;

  public EnterpriseAIException(
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
    super(message, cause);
    this.status = status;
    this.code = code;
    this.messageI18n = messageI18n == null ? Map.of() : Map.copyOf(messageI18n);
    this.requestId = requestId;
    this.decisionId = decisionId;
    this.invocationId = invocationId;
    this.details = details;
    this.retryAfter = retryAfter == null ? Duration.ZERO : retryAfter;
  }

  /** The HTTP status, 0 when no answer was received. */
  public int status() {
    return status;
  }

  /** The stable snake_case code: policy_denied, tool_not_found, rate_limited, … */
  public String code() {
    return code;
  }

  /** The message in every language ("en", "fr"). */
  public Map<String, String> messageI18n() {
    return messageI18n;
  }

  public Optional<String> requestId() {
    return Optional.ofNullable(requestId);
  }

  public Optional<String> decisionId() {
    return Optional.ofNullable(decisionId);
  }

  public Optional<String> invocationId() {
    return Optional.ofNullable(invocationId);
  }

  /** The envelope's details (an empty object when none). */
  public JsonNode details() {
    return details;
  }

  /** The server's Retry-After (429, 503), zero when absent. */
  public Duration retryAfter() {
    return retryAfter;
  }

  /** Whether the same request may succeed later unchanged (429, 503). */
  public boolean isRetryable() {
    return status == 429 || status == 503;
  }

  @Override
  public String toString() {
    return getClass().getSimpleName() + "(" + status + " " + code + ": " + getMessage() + ")";
  }
}
