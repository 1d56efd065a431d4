package ai.enterprise.sdk;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.Optional;

/**
 * A typed view of an invocation (the JsonNode the calls return stays the whole object).
 *
 * @param raw the invocation exactly as the gateway sent it
 */
public record Invocation(
    String invocationId,
    String tool,
    String status,
    Optional<String> approvalId,
    Optional<String> decisionId,
    Optional<String> runId,
    JsonNode output,
    Optional<String> errorCode,
    JsonNode raw) {

  /** Reads an invocation object. */
  public static Invocation from(JsonNode node) {
    return new Invocation(
        node.path("invocation_id").asText(),
        node.path("tool").asText(),
        node.path("status").asText(),
        text(node.get("approval_id")),
        text(node.get("decision_id")),
        text(node.get("run_id")),
        node.get("output"),
        text(node.path("error").get("code")),
        node);
  }

  /** Whether it may still change: waiting for approval, queued or running. */
  public boolean isPending() {
    return status.equals("waiting_approval") || status.equals("queued") || status.equals("running");
  }

  private static Optional<String> text(JsonNode node) {
    return node == null || node.isNull() ? Optional.empty() : Optional.of(node.asText());
  }
}
