package ai.enterprise.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The client's own rules, against a local server answering as the gateway does. */
class ClientTest {
  HttpServer server;
  final List<String> keys = Collections.synchronizedList(new ArrayList<>());

  String serve(int... statuses) throws IOException {
    AtomicInteger n = new AtomicInteger();
    server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
    server.createContext("/", exchange -> {
      keys.add(String.valueOf(exchange.getRequestHeaders().getFirst("Idempotency-Key")));
      int status = statuses[Math.min(n.getAndIncrement(), statuses.length - 1)];
      String body = status == 200
          ? "{\"invocation_id\": \"tinv_1\", \"status\": \"succeeded\"}"
          : status == 502
              ? "<html>bad gateway</html>"
              : "{\"error\": {\"code\": \"c" + status + "\", \"message\": \"m\", \"message_i18n\": {\"en\": \"m\", \"fr\": \"m\"}, \"details\": {}, \"request_id\": \"req_1\", \"decision_id\": null}}";
      if (status == 429 || status == 503) {
        exchange.getResponseHeaders().add("Retry-After", "1");
      }
      byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
      exchange.sendResponseHeaders(status, bytes.length);
      exchange.getResponseBody().write(bytes);
      exchange.close();
    });
    server.start();
    return "http://127.0.0.1:" + server.getAddress().getPort();
  }

  @AfterEach
  void stop() {
    if (server != null) {
      server.stop(0);
    }
  }

  @Test
  void itRetriesA429AfterRetryAfterWithTheSameIdempotencyKey() throws IOException {
    String url = serve(429, 200);
    long start = System.nanoTime();
    var out = EnterpriseAIClient.builder().baseUrl(url).apiKey("eai_a_b").build()
        .tools().invoke("t", Map.of("arguments", Map.of()));
    assertEquals("succeeded", out.get("status").asText());
    assertTrue(Duration.ofNanos(System.nanoTime() - start).toMillis() >= 1000);
    assertEquals(2, keys.size());
    assertFalse(keys.get(0).equals("null"));
    assertEquals(keys.get(0), keys.get(1));
  }

  @Test
  void itNeverRetriesAWriteWithoutAnIdempotencyKey() throws IOException {
    String url = serve(503, 200);
    UnavailableException e = assertThrows(UnavailableException.class,
        () -> EnterpriseAIClient.builder().baseUrl(url).apiKey("eai_a_b").build()
            .approvals().decide("apr_1", "approve", "ok"));
    assertEquals("c503", e.code());
    assertEquals(1, keys.size());
  }

  @Test
  void itRetriesNothingWhenTold() throws IOException {
    String url = serve(429, 200);
    RateLimitException e = assertThrows(RateLimitException.class,
        () -> EnterpriseAIClient.builder().baseUrl(url).apiKey("eai_a_b").maxRetries(0).build().tools().get("t"));
    assertEquals(Duration.ofSeconds(1), e.retryAfter());
    assertEquals(1, keys.size());
  }

  @Test
  void anAnswerWithoutTheEnvelopeIsStillATypedError() throws IOException {
    String url = serve(502);
    ToolException e = assertThrows(ToolException.class,
        () -> EnterpriseAIClient.builder().baseUrl(url).apiKey("eai_a_b").build().invocations().get("tinv_1"));
    assertEquals("http_error", e.code());
    assertEquals(502, e.status());
  }

  @Test
  void aConnectionFailureIsAnErrorWithoutStatus() throws IOException {
    String url = serve(200);
    server.stop(0);
    server = null;
    ConnectionException e = assertThrows(ConnectionException.class,
        () -> EnterpriseAIClient.builder().baseUrl(url).apiKey("eai_a_b").build().tools().get("t"));
    assertEquals(0, e.status());
    assertEquals("connection_error", e.code());
  }

  @Test
  void itRefusesAClientWithoutUrlOrKey() {
    assertThrows(IllegalArgumentException.class, () -> EnterpriseAIClient.builder().apiKey("k").build());
    assertThrows(IllegalArgumentException.class, () -> EnterpriseAIClient.builder().baseUrl("ftp://x").apiKey("k").build());
    assertThrows(IllegalArgumentException.class, () -> EnterpriseAIClient.builder().baseUrl("http://x").build());
  }
}
