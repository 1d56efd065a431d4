package ai.enterprise.sdk;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.Optional;
import java.util.function.Function;

/**
 * The Java client of the EAI Tool Gateway. Thread-safe: share one per gateway and key.
 *
 * <pre>{@code
 * JsonNode out = EnterpriseAIClient.builder().baseUrl(url).apiKey(key).build()
 *     .tools().invoke("jira.search", Map.of("arguments", Map.of("q", "INC-42")));
 * }</pre>
 *
 * Every error is an {@link EnterpriseAIException} (unchecked). A 429 or 503 answer is
 * retried after its Retry-After, only for reads and for writes carrying an idempotency
 * key ({@code invoke} generates one when none is given).
 */
public final class EnterpriseAIClient {
  public static final String VERSION = "0.1.0";
  private static final SecureRandom RANDOM = new SecureRandom();

  private final String baseUrl;
  private final String apiKey;
  private final String language;
  private final Duration timeout;
  private final int maxRetries;
  private final Duration maxBackoff;
  private final String userAgent;
  private final HttpClient http;
  private final ObjectMapper mapper;

  private EnterpriseAIClient(Builder b) {
    this.baseUrl = b.baseUrl;
    this.apiKey = b.apiKey;
    this.language = b.language;
    this.timeout = b.timeout;
    this.maxRetries = b.maxRetries;
    this.maxBackoff = b.maxBackoff;
    this.userAgent = b.userAgent;
    this.http =
        b.httpClient != null
            ? b.httpClient
            : HttpClient.newBuilder().connectTimeout(b.timeout).build();
    this.mapper = b.mapper != null ? b.mapper : new ObjectMapper();
  }

  public static Builder builder() {
    return new Builder();
  }

  /** Builds a client; {@code baseUrl} and {@code apiKey} are required. */
  public static final class Builder {
    private String baseUrl;
    private String apiKey;
    private String language;
    private Duration timeout = Duration.ofSeconds(30);
    private int maxRetries = 2;
    private Duration maxBackoff = Duration.ofSeconds(30);
    private String userAgent = "enterprise-ai-java/" + VERSION;
    private HttpClient httpClient;
    private ObjectMapper mapper;

    private Builder() {}

    /** The gateway's URL, e.g. {@code https://gateway.example.com}. */
    public Builder baseUrl(String url) {
      this.baseUrl = url;
      return this;
    }

    /** The API key ({@code eai_<id>_<secret>}), sent as a Bearer token. */
    public Builder apiKey(String key) {
      this.apiKey = key;
      return this;
    }

    /** Error messages in "en" (default) or "fr". */
    public Builder language(String language) {
      this.language = language;
      return this;
    }

    /** Bounds each request (default 30 s; a long poll adds its wait). */
    public Builder timeout(Duration timeout) {
      this.timeout = Objects.requireNonNull(timeout);
      return this;
    }

    /** How many times a 429 or 503 answer is retried (default 2). */
    public Builder maxRetries(int retries) {
      if (retries < 0) {
        throw new IllegalArgumentException("maxRetries must be >= 0");
      }
      this.maxRetries = retries;
      return this;
    }

    /** Caps the wait between retries, whatever Retry-After says (default 30 s). */
    public Builder maxBackoff(Duration maxBackoff) {
      this.maxBackoff = Objects.requireNonNull(maxBackoff);
      return this;
    }

    public Builder userAgent(String userAgent) {
      this.userAgent = Objects.requireNonNull(userAgent);
      return this;
    }

    /** A java.net.http client of yours (proxies, TLS, executor). */
    public Builder httpClient(HttpClient client) {
      this.httpClient = Objects.requireNonNull(client);
      return this;
    }

    public Builder objectMapper(ObjectMapper mapper) {
      this.mapper = Objects.requireNonNull(mapper);
      return this;
    }

    public EnterpriseAIClient build() {
      if (baseUrl == null || !(baseUrl.startsWith("http://") || baseUrl.startsWith("https://"))) {
        throw new IllegalArgumentException("baseUrl must be an http(s) URL, got " + baseUrl);
      }
      if (apiKey == null || apiKey.isEmpty()) {
        throw new IllegalArgumentException("apiKey is required");
      }
      baseUrl = baseUrl.replaceAll("/+$", "");
      return new EnterpriseAIClient(this);
    }
  }

  public Tools tools() {
    return new Tools();
  }

  public Invocations invocations() {
    return new Invocations();
  }

  public Runs runs() {
    return new Runs();
  }

  public Events events() {
    return new Events();
  }

  public Approvals approvals() {
    return new Approvals();
  }

  public Decisions decisions() {
    return new Decisions();
  }

  public Manifests manifests() {
    return new Manifests();
  }

  public Contracts contracts() {
    return new Contracts();
  }

  public Usage usage() {
    return new Usage();
  }

  public Audit audit() {
    return new Audit();
  }

  /** The URL an MCP client uses for this gateway (Streamable HTTP). */
  public String mcpEndpoint() {
    return baseUrl + "/v1/mcp";
  }

  /** The headers an MCP client sends with every request. */
  public Map<String, String> mcpHeaders() {
    return Map.of("Authorization", "Bearer " + apiKey);
  }

  /** A fresh random Idempotency-Key. */
  public static String newIdempotencyKey() {
    byte[] bytes = new byte[16];
    RANDOM.nextBytes(bytes);
    return "sdk-java-" + HexFormat.of().formatHex(bytes);
  }

  // ---- the services -----------------------------------------------------------------

  /** The catalog and the invoke pipeline. */
  public final class Tools {
    private Tools() {}

    /**
     * Calls a tool through the pipeline. The request holds "arguments" (the tool's input;
     * "input" is accepted too) and may hold "run_id", "step_index", "idempotency_key",
     * "respond_async" (Boolean) and "traceparent". A parked, queued or running call is not
     * an error: the invocation comes back with that status.
     */
    public JsonNode invoke(String name, Map<String, ?> request) {
      Map<String, Object> body = new LinkedHashMap<>();
      Map<String, String> headers = new LinkedHashMap<>();
      for (Map.Entry<String, ?> e : request.entrySet()) {
        switch (e.getKey()) {
          case "arguments", "input" -> body.put("input", e.getValue());
          case "idempotency_key" -> headers.put("Idempotency-Key", String.valueOf(e.getValue()));
          case "respond_async" -> {
            if (Boolean.TRUE.equals(e.getValue())) {
              headers.put("Prefer", "respond-async");
            }
          }
          case "traceparent" -> headers.put("traceparent", String.valueOf(e.getValue()));
          default -> body.put(e.getKey(), e.getValue());
        }
      }
      body.putIfAbsent("input", Map.of());
      if (!headers.containsKey("Idempotency-Key") && maxRetries > 0) {
        headers.put("Idempotency-Key", newIdempotencyKey());
      }
      return send("POST", "/v1/tools/" + seg(name) + "/invoke", null, body, headers, null);
    }

    /** Calls a tool with its input only. */
    public JsonNode invoke(String name, Object arguments, String runId) {
      Map<String, Object> request = new LinkedHashMap<>();
      request.put("arguments", arguments);
      if (runId != null) {
        request.put("run_id", runId);
      }
      return invoke(name, request);
    }

    public Page list(Integer limit, String cursor) {
      return page(send("GET", "/v1/tools", paging(limit, cursor), null, null, null));
    }

    public Iterable<JsonNode> iterate() {
      return pages(cursor -> list(null, cursor));
    }

    public JsonNode get(String name) {
      return send("GET", "/v1/tools/" + seg(name), null, null, null, null);
    }
  }

  /** Reading, waiting on and cancelling invocations. */
  public final class Invocations {
    private Invocations() {}

    public JsonNode get(String id) {
      return send("GET", "/v1/tools/invocations/" + seg(id), null, null, null, null);
    }

    /**
     * Long-polls an invocation until its status is final or the timeout passes; returns it
     * as it then is.
     */
    public JsonNode waitFor(String id, Duration timeout) {
      long deadline = System.nanoTime() + timeout.toNanos();
      while (true) {
        long leftSeconds = Math.min(30, (deadline - System.nanoTime()) / 1_000_000_000L);
        Map<String, String> query = new LinkedHashMap<>();
        if (leftSeconds >= 1) {
          query.put("wait", Long.toString(leftSeconds));
        }
        JsonNode inv =
            send(
                "GET",
                "/v1/tools/invocations/" + seg(id),
                query,
                null,
                null,
                Duration.ofSeconds(Math.max(leftSeconds, 0)));
        if (!Invocation.from(inv).isPending() || deadline - System.nanoTime() < 1_000_000_000L) {
          return inv;
        }
        if (leftSeconds < 1) {
          sleep(Duration.ofMillis(250));
        }
      }
    }

    /** One page; filters: status, tool, run_id, agent, limit, cursor. */
    public Page list(Map<String, ?> filters) {
      return page(send("GET", "/v1/tools/invocations", strings(filters), null, null, null));
    }

    /** Every invocation the filters select, page after page, newest first. */
    public Iterable<JsonNode> iterate(Map<String, ?> filters) {
      return pages(
          cursor -> {
            Map<String, Object> f = new LinkedHashMap<>(filters);
            if (cursor != null) {
              f.put("cursor", cursor);
            }
            return list(f);
          });
    }

    public JsonNode cancel(String id) {
      return send("POST", "/v1/tools/invocations/" + seg(id) + "/cancel", null, Map.of(), null, null);
    }
  }

  /** Agent turns. */
  public final class Runs {
    private Runs() {}

    public JsonNode create(String runId, String goal) {
      Map<String, Object> body = new LinkedHashMap<>();
      if (runId != null) {
        body.put("run_id", runId);
      }
      if (goal != null) {
        body.put("goal", goal);
      }
      return send("POST", "/v1/runs", null, body, null, null);
    }

    public JsonNode get(String runId) {
      return send("GET", "/v1/runs/" + seg(runId), null, null, null, null);
    }

    public JsonNode resume(String runId) {
      return send("POST", "/v1/runs/" + seg(runId) + "/resume", null, Map.of(), null, null);
    }
  }

  /** The tenant's event feed. */
  public final class Events {
    private Events() {}

    /** Events after the cursor (a sequence), optionally of one run. */
    public Page list(String runId, Integer limit, String cursor) {
      Map<String, String> query = paging(limit, cursor);
      if (runId != null) {
        query.put("run_id", runId);
      }
      return page(send("GET", "/v1/events", query, null, null, null));
    }

    public Iterable<JsonNode> iterate(String runId) {
      return pages(cursor -> list(runId, null, cursor));
    }
  }

  /** The reviewers' side (a staff reviewer's key). */
  public final class Approvals {
    private Approvals() {}

    public Page list(Map<String, ?> filters) {
      return page(send("GET", "/v1/approvals", strings(filters), null, null, null));
    }

    public Iterable<JsonNode> iterate(Map<String, ?> filters) {
      return pages(
          cursor -> {
            Map<String, Object> f = new LinkedHashMap<>(filters);
            if (cursor != null) {
              f.put("cursor", cursor);
            }
            return list(f);
          });
    }

    /** Approves or denies ("approve" | "deny") with a mandatory reason. */
    public JsonNode decide(String approvalId, String verdict, String reason) {
      return send(
          "POST",
          "/v1/approvals/" + seg(approvalId) + "/decision",
          null,
          Map.of("verdict", verdict, "reason", reason),
          null,
          null);
    }
  }

  /** Recorded policy decisions. */
  public final class Decisions {
    private Decisions() {}

    public JsonNode get(String id) {
      return send("GET", "/v1/decisions/" + seg(id), null, null, null, null);
    }
  }

  /** Applying manifests, all or nothing. */
  public final class Manifests {
    private Manifests() {}

    /** One manifest, or {@code Map.of("manifests", List.of(...))}. */
    public JsonNode apply(Object manifests, boolean dryRun) {
      return send("POST", "/v1/manifests/apply", dryRun ? Map.of("dry_run", "true") : null, manifests, null, null);
    }

    public JsonNode dryRun(Object manifests) {
      return apply(manifests, true);
    }
  }

  /** The JSON Schemas of manifests. */
  public final class Contracts {
    private Contracts() {}

    public JsonNode get(String name) {
      return send("GET", "/v1/contracts/" + seg(name), null, null, null, null);
    }

    public JsonNode validate(String name, Object document) {
      return send("POST", "/v1/contracts/" + seg(name) + "/validate", null, document, null, null);
    }
  }

  /** FinOps usage. */
  public final class Usage {
    private Usage() {}

    public JsonNode report(Object usage) {
      return send("POST", "/v1/finops/usage", null, usage, null, null);
    }

    /** Aggregates: group_by (tool | agent | run), from, to. */
    public JsonNode get(Map<String, ?> query) {
      return send("GET", "/v1/finops/usage", strings(query), null, null, null);
    }
  }

  /** The tenant's hash-chained audit log. */
  public final class Audit {
    private Audit() {}

    public Page events(Integer limit, String cursor) {
      return page(send("GET", "/v1/audit/events", paging(limit, cursor), null, null, null));
    }

    public JsonNode verify() {
      return send("GET", "/v1/audit/verify", null, null, null, null);
    }
  }

  // ---- transport --------------------------------------------------------------------

  JsonNode send(
      String method,
      String path,
      Map<String, String> query,
      Object body,
      Map<String, String> headers,
      Duration extra) {
    StringBuilder url = new StringBuilder(baseUrl).append(path);
    if (query != null && !query.isEmpty()) {
      char sep = '?';
      for (Map.Entry<String, String> e : query.entrySet()) {
        url.append(sep).append(enc(e.getKey())).append('=').append(enc(e.getValue()));
        sep = '&';
      }
    }
    byte[] payload;
    try {
      payload = body == null ? null : mapper.writeValueAsBytes(body);
    } catch (JsonProcessingException e) {
      throw new ValidationException(0, "invalid_request", e.getMessage(), null, null, null, null, null, null, e);
    }
    HttpRequest.Builder rb =
        HttpRequest.newBuilder(URI.create(url.toString()))
            .timeout(extra == null ? timeout : timeout.plus(extra))
            .header("Authorization", "Bearer " + apiKey)
            .header("Accept", "application/json")
            .header("User-Agent", userAgent);
    if (language != null) {
      rb.header("Accept-Language", language);
    }
    if (payload != null) {
      rb.header("Content-Type", "application/json");
      rb.method(method, HttpRequest.BodyPublishers.ofByteArray(payload));
    } else {
      rb.method(method, HttpRequest.BodyPublishers.noBody());
    }
    if (headers != null) {
      headers.forEach(rb::header);
    }
    HttpRequest request = rb.build();
    boolean safe = method.equals("GET") || (headers != null && headers.containsKey("Idempotency-Key"));
    for (int attempt = 0; ; attempt++) {
      try {
        return once(request);
      } catch (EnterpriseAIException e) {
        if (!safe || attempt >= maxRetries || !e.isRetryable()) {
          throw e;
        }
        Duration wait = e.retryAfter();
        if (wait.isZero()) {
          wait = Duration.ofMillis(250L << attempt);
        }
        sleep(wait.compareTo(maxBackoff) > 0 ? maxBackoff : wait);
      }
    }
  }

  private JsonNode once(HttpRequest request) {
    HttpResponse<byte[]> response;
    try {
      response = http.send(request, HttpResponse.BodyHandlers.ofByteArray());
    } catch (HttpTimeoutException e) {
      throw new ConnectionException(0, "timeout", "request timed out: " + e.getMessage(), null, null, null, null, null, null, e);
    } catch (IOException e) {
      throw new ConnectionException(0, "connection_error", "connection failed: " + e, null, null, null, null, null, null, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new ConnectionException(0, "cancelled", "interrupted", null, null, null, null, null, null, e);
    }
    int status = response.statusCode();
    byte[] raw = response.body();
    JsonNode node = null;
    if (raw != null && raw.length > 0) {
      try {
        node = mapper.readTree(raw);
      } catch (IOException e) {
        node = null;
      }
    }
    if (status >= 200 && status < 300) {
      if (node == null) {
        if (raw != null && raw.length > 0) {
          throw new EnterpriseAIException(status, "invalid_response", "response is not JSON", null, null, null, null, null, null, null);
        }
        return JsonNodeFactory.instance.objectNode();
      }
      return node;
    }
    throw errorFrom(status, node, response.headers().firstValue("Retry-After").orElse(null));
  }

  static EnterpriseAIException errorFrom(int status, JsonNode node, String retryAfterHeader) {
    Duration retryAfter = parseRetryAfter(retryAfterHeader);
    JsonNode error = node == null ? null : node.get("error");
    String code = "http_error";
    String message = "HTTP " + status + " without the error envelope";
    Map<String, String> i18n = null;
    String requestId = null;
    String decisionId = null;
    String invocationId = null;
    JsonNode details = JsonNodeFactory.instance.objectNode();
    if (error != null && error.isObject() && error.hasNonNull("code")) {
      code = error.get("code").asText();
      message = error.path("message").asText();
      i18n = new LinkedHashMap<>();
      for (Iterator<Map.Entry<String, JsonNode>> it = error.path("message_i18n").fields(); it.hasNext(); ) {
        Map.Entry<String, JsonNode> e = it.next();
        i18n.put(e.getKey(), e.getValue().asText());
      }
      requestId = textOrNull(error.get("request_id"));
      decisionId = textOrNull(error.get("decision_id"));
      invocationId = textOrNull(error.get("invocation_id"));
      if (invocationId == null) {
        invocationId = textOrNull(node.get("invocation_id"));
      }
      if (error.has("details") && !error.get("details").isNull()) {
        details = error.get("details");
      }
    }
    return switch (status) {
      case 400, 413, 415, 422 -> new ValidationException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 401 -> new AuthenticationException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 403 -> new PermissionDeniedException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 404 -> new NotFoundException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 409 -> new ConflictException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 429 -> new RateLimitException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 502, 504 -> new ToolException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      case 503 -> new UnavailableException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
      default -> new EnterpriseAIException(status, code, message, i18n, requestId, decisionId, invocationId, details, retryAfter, null);
    };
  }

  static Duration parseRetryAfter(String value) {
    if (value == null || value.isBlank()) {
      return Duration.ZERO;
    }
    try {
      double seconds = Double.parseDouble(value.trim());
      return seconds > 0 ? Duration.ofMillis((long) (seconds * 1000)) : Duration.ZERO;
    } catch (NumberFormatException e) {
      try {
        Duration d = Duration.between(ZonedDateTime.now(), ZonedDateTime.parse(value.trim(), DateTimeFormatter.RFC_1123_DATE_TIME));
        return d.isNegative() ? Duration.ZERO : d;
      } catch (RuntimeException ignored) {
        return Duration.ZERO;
      }
    }
  }

  private Page page(JsonNode node) {
    List<JsonNode> rows = new ArrayList<>();
    node.path("results").forEach(rows::add);
    JsonNode next = node.get("next_cursor");
    return new Page(List.copyOf(rows), next == null || next.isNull() || next.asText().isEmpty() ? Optional.empty() : Optional.of(next.asText()));
  }

  private static Iterable<JsonNode> pages(Function<String, Page> fetch) {
    return () ->
        new Iterator<>() {
          private Iterator<JsonNode> rows = List.<JsonNode>of().iterator();
          private String cursor;
          private boolean done;

          @Override
          public boolean hasNext() {
            while (!rows.hasNext() && !done) {
              Page page = fetch.apply(cursor);
              rows = page.results().iterator();
              cursor = page.nextCursor().orElse(null);
              done = cursor == null;
            }
            return rows.hasNext();
          }

          @Override
          public JsonNode next() {
            if (!hasNext()) {
              throw new NoSuchElementException();
            }
            return rows.next();
          }
        };
  }

  private static Map<String, String> paging(Integer limit, String cursor) {
    Map<String, String> query = new LinkedHashMap<>();
    if (limit != null) {
      query.put("limit", limit.toString());
    }
    if (cursor != null) {
      query.put("cursor", cursor);
    }
    return query;
  }

  private static Map<String, String> strings(Map<String, ?> values) {
    Map<String, String> out = new LinkedHashMap<>();
    if (values != null) {
      values.forEach((k, v) -> {
        if (v != null) {
          out.put(k, String.valueOf(v));
        }
      });
    }
    return out;
  }

  private static String textOrNull(JsonNode node) {
    return node == null || node.isNull() ? null : node.asText();
  }

  private static String seg(String s) {
    return enc(s).replace("+", "%20");
  }

  private static String enc(String s) {
    return URLEncoder.encode(s, StandardCharsets.UTF_8);
  }

  private static void sleep(Duration d) {
    try {
      Thread.sleep(d.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new ConnectionException(0, "cancelled", "interrupted", null, null, null, null, null, null, e);
    }
  }
}
