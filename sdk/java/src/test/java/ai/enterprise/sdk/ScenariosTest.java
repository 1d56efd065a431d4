package ai.enterprise.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.function.BiConsumer;
import java.util.stream.Stream;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/** The shared behaviours of sdk/scenarios.json against a live gateway (`make sdk`). */
class ScenariosTest {
  static final ObjectMapper MAPPER = new ObjectMapper();

  record Config(String baseUrl, String scenarios, Map<String, String> keys) {}

  static Config config() throws IOException {
    String path = System.getenv("EAI_SDK_TEST_CONFIG");
    if (path == null || path.isEmpty()) {
      if ("1".equals(System.getenv("EAI_SDK_REQUIRE"))) {
        fail("EAI_SDK_TEST_CONFIG is not set: run `make sdk`");
      }
      Assumptions.abort("no live gateway: run `make sdk` (EAI_SDK_TEST_CONFIG)");
    }
    JsonNode node = MAPPER.readTree(new File(path));
    Map<String, String> keys = new LinkedHashMap<>();
    node.get("keys").fields().forEachRemaining(e -> keys.put(e.getKey(), e.getValue().asText()));
    return new Config(node.get("base_url").asText(), node.get("scenarios").asText(), keys);
  }

  static EnterpriseAIClient client(Config cfg, String key) {
    return EnterpriseAIClient.builder().baseUrl(cfg.baseUrl()).apiKey(cfg.keys().get(key)).build();
  }

  static String fill(String s, String nonce) {
    return s.replace("{lang}", "java").replace("{nonce}", nonce);
  }

  static Map<String, Object> req(JsonNode input, Map<String, Object> extra) {
    Map<String, Object> r = new LinkedHashMap<>(extra);
    r.put("arguments", MAPPER.convertValue(input, Map.class));
    return r;
  }

  static EnterpriseAIException checkError(Runnable call, JsonNode want) {
    EnterpriseAIException e = assertThrows(EnterpriseAIException.class, call::run);
    if (want.has("status")) {
      assertEquals(want.get("status").asInt(), e.status(), e.toString());
    }
    if (want.has("code")) {
      assertEquals(want.get("code").asText(), e.code(), e.toString());
    }
    if (want.has("decision_id_prefix")) {
      assertTrue(e.decisionId().orElse("").startsWith(want.get("decision_id_prefix").asText()), e.toString());
    }
    if (want.has("request_id_prefix")) {
      assertTrue(e.requestId().orElse("").startsWith(want.get("request_id_prefix").asText()));
    }
    if (want.has("message_contains")) {
      assertTrue(e.getMessage().contains(want.get("message_contains").asText()), e.getMessage());
    }
    if (want.has("message_i18n_en_contains")) {
      assertTrue(e.messageI18n().get("en").contains(want.get("message_i18n_en_contains").asText()));
    }
    assertTrue(e.messageI18n().containsKey("en") && e.messageI18n().containsKey("fr"));
    return e;
  }

  static final Map<String, BiConsumer<Config, JsonNode>> RUNNERS = new LinkedHashMap<>();

  static {
    RUNNERS.put("invoke_masks_iban", (cfg, s) -> {
      String nonce = UUID.randomUUID().toString().substring(0, 8);
      JsonNode out = client(cfg, s.get("key").asText()).tools()
          .invoke(s.get("tool").asText(), req(s.get("input"), Map.of("run_id", fill(s.get("run_id").asText(), nonce))));
      JsonNode expect = s.get("expect");
      assertEquals(expect.get("status").asText(), out.get("status").asText());
      assertTrue(out.get("invocation_id").asText().startsWith(expect.get("invocation_id_prefix").asText()));
      assertTrue(out.get("output").toString().contains(expect.get("output_contains").asText()));
      assertFalse(out.toString().contains(expect.get("output_not_contains").asText()));
    });
    RUNNERS.put("policy_denied", (cfg, s) -> checkError(
        () -> client(cfg, s.get("key").asText()).tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of())),
        s.get("expect_error")));
    RUNNERS.put("tool_not_found", RUNNERS.get("policy_denied"));
    RUNNERS.put("parked_then_wait", (cfg, s) -> {
      EnterpriseAIClient agent = client(cfg, s.get("key").asText());
      Invocation parked = Invocation.from(agent.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of())));
      assertEquals(s.get("expect").get("status").asText(), parked.status());
      String approval = parked.approvalId().orElseThrow();
      assertTrue(approval.startsWith(s.get("expect").get("approval_id_prefix").asText()));
      JsonNode approve = s.get("approve");
      client(cfg, approve.get("key").asText()).approvals()
          .decide(approval, approve.get("verdict").asText(), approve.get("reason").asText());
      JsonNode done = agent.invocations().waitFor(parked.invocationId(), Duration.ofSeconds(s.get("wait_seconds").asInt()));
      assertEquals(s.get("expect_after_wait").get("status").asText(), done.get("status").asText());
    });
    RUNNERS.put("idempotent_replay_and_conflict", (cfg, s) -> {
      EnterpriseAIClient c = client(cfg, s.get("key").asText());
      String key = fill(s.get("idempotency_key").asText(), UUID.randomUUID().toString());
      JsonNode first = c.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of("idempotency_key", key)));
      JsonNode again = c.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of("idempotency_key", key)));
      assertEquals(first.get("invocation_id"), again.get("invocation_id"));
      checkError(
          () -> c.tools().invoke(s.get("tool").asText(), req(s.get("conflict_input"), Map.of("idempotency_key", key))),
          s.get("expect_error_on_conflict"));
    });
    RUNNERS.put("rate_limited_then_success", (cfg, s) -> {
      EnterpriseAIClient noRetry = EnterpriseAIClient.builder().baseUrl(cfg.baseUrl())
          .apiKey(cfg.keys().get(s.get("key").asText())).maxRetries(0).build();
      EnterpriseAIException limited = null;
      for (int i = 0; i < 3 && limited == null; i++) {
        try {
          noRetry.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of()));
        } catch (RateLimitException e) {
          limited = e;
        }
      }
      assertNotNull(limited, "three calls in a row were never rate limited");
      JsonNode want = s.get("expect_error_without_retry");
      assertEquals(want.get("code").asText(), limited.code());
      assertEquals(want.get("status").asInt(), limited.status());
      assertTrue(limited.retryAfter().getSeconds() >= want.get("retry_after_min_seconds").asInt());
      EnterpriseAIClient retrying = EnterpriseAIClient.builder().baseUrl(cfg.baseUrl())
          .apiKey(cfg.keys().get(s.get("key").asText())).maxRetries(3).build();
      for (int i = 0; i < 2; i++) {
        JsonNode out = retrying.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of()));
        assertEquals(s.get("expect_with_retry").get("status").asText(), out.get("status").asText());
      }
    });
    RUNNERS.put("pagination", (cfg, s) -> {
      EnterpriseAIClient c = client(cfg, s.get("key").asText());
      String runId = fill(s.get("run_id").asText(), UUID.randomUUID().toString().substring(0, 8));
      Set<String> made = new HashSet<>();
      for (int i = 0; i < s.get("calls").asInt(); i++) {
        made.add(c.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of("run_id", runId, "step_index", i)))
            .get("invocation_id").asText());
      }
      int pageSize = s.get("page_size").asInt();
      int pages = 0;
      String cursor = null;
      do {
        Map<String, Object> filter = new LinkedHashMap<>(Map.of("run_id", runId, "limit", pageSize));
        if (cursor != null) {
          filter.put("cursor", cursor);
        }
        Page page = c.invocations().list(filter);
        pages++;
        cursor = page.nextCursor().orElse(null);
      } while (cursor != null);
      List<String> seen = new ArrayList<>();
      c.invocations().iterate(Map.of("run_id", runId, "limit", pageSize))
          .forEach(row -> seen.add(row.get("invocation_id").asText()));
      assertEquals(s.get("expect").get("count").asInt(), seen.size());
      assertEquals(made, new HashSet<>(seen));
      assertTrue(pages >= s.get("expect").get("min_pages").asInt(), "pages: " + pages);
    });
    RUNNERS.put("french_message", (cfg, s) -> {
      EnterpriseAIClient c = EnterpriseAIClient.builder().baseUrl(cfg.baseUrl())
          .apiKey(cfg.keys().get(s.get("key").asText())).language(s.get("language").asText()).build();
      checkError(() -> c.tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of())), s.get("expect_error"));
    });
    RUNNERS.put("cross_tenant_not_found", (cfg, s) -> {
      JsonNode inv = client(cfg, s.get("key").asText()).tools().invoke(s.get("tool").asText(), req(s.get("input"), Map.of()));
      checkError(
          () -> client(cfg, s.get("other_key").asText()).invocations().get(inv.get("invocation_id").asText()),
          s.get("expect_error"));
    });
  }

  @TestFactory
  Stream<DynamicTest> scenarios() throws IOException {
    Config cfg = config();
    JsonNode file = MAPPER.readTree(new File(cfg.scenarios()));
    List<DynamicTest> tests = new ArrayList<>();
    for (JsonNode s : file.get("scenarios")) {
      String id = s.get("id").asText();
      tests.add(DynamicTest.dynamicTest(id, () -> {
        BiConsumer<Config, JsonNode> run = RUNNERS.get(id);
        if (run == null) {
          fail("scenario " + id + " is not implemented by the Java SDK");
        }
        run.accept(cfg, s);
      }));
    }
    assertFalse(tests.isEmpty());
    return tests.stream();
  }
}
