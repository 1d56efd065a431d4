// The client's own rules, against a local server answering as the gateway does.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { EnterpriseAI, EnterpriseAIError } from "../dist/esm/index.js";

async function serve(statuses) {
  const keys = [];
  let n = 0;
  const server = createServer((req, res) => {
    keys.push(req.headers["idempotency-key"] ?? null);
    const status = statuses[Math.min(n++, statuses.length - 1)];
    if (status === 429 || status === 503) res.setHeader("Retry-After", "1");
    res.statusCode = status;
    res.setHeader("Content-Type", "application/json");
    res.end(
      status === 200
        ? JSON.stringify({ invocation_id: "tinv_1", status: "succeeded" })
        : status === 502
          ? "<html>bad gateway</html>"
          : JSON.stringify({ error: { code: `c${status}`, message: "m", message_i18n: { en: "m", fr: "m" }, details: {}, request_id: "req_1" } }),
    );
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, keys, close: () => server.close() };
}

test("a 429 is retried after Retry-After with the same idempotency key", async () => {
  const s = await serve([429, 200]);
  const started = Date.now();
  const out = await new EnterpriseAI({ baseUrl: s.url, apiKey: "eai_a_b" }).tools.invoke("t", { arguments: {} });
  s.close();
  assert.equal(out.status, "succeeded");
  assert.ok(Date.now() - started >= 1000);
  assert.equal(s.keys.length, 2);
  assert.ok(s.keys[0]);
  assert.equal(s.keys[0], s.keys[1]);
});

test("a write without an idempotency key is never retried", async () => {
  const s = await serve([503, 200]);
  const error = await new EnterpriseAI({ baseUrl: s.url, apiKey: "eai_a_b" }).approvals
    .decide("apr_1", { verdict: "approve", reason: "ok" })
    .catch((e) => e);
  s.close();
  assert.ok(error instanceof EnterpriseAIError);
  assert.equal(error.code, "c503");
  assert.equal(s.keys.length, 1);
});

test("no retry when told", async () => {
  const s = await serve([429, 200]);
  const error = await new EnterpriseAI({ baseUrl: s.url, apiKey: "eai_a_b", maxRetries: 0 }).tools.get("t").catch((e) => e);
  s.close();
  assert.equal(error.status, 429);
  assert.equal(error.retry_after, 1);
  assert.equal(s.keys.length, 1);
});

test("an answer without the envelope is still a typed error", async () => {
  const s = await serve([502]);
  const error = await new EnterpriseAI({ baseUrl: s.url, apiKey: "eai_a_b" }).invocations.get("tinv_1").catch((e) => e);
  s.close();
  assert.ok(error instanceof EnterpriseAIError);
  assert.equal(error.code, "http_error");
  assert.equal(error.status, 502);
});

test("an AbortSignal stops the call and its retry wait", async () => {
  const s = await serve([503]);
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 100);
  const started = Date.now();
  const error = await new EnterpriseAI({ baseUrl: s.url, apiKey: "eai_a_b" }).tools.get("t", { signal: controller.signal }).catch((e) => e);
  s.close();
  assert.ok(Date.now() - started < 900, "the retry wait was not cut short");
  assert.ok(error);
});

test("a refused connection is an error without status", async () => {
  const s = await serve([200]);
  s.close();
  await new Promise((r) => setTimeout(r, 50));
  const error = await new EnterpriseAI({ baseUrl: s.url, apiKey: "eai_a_b" }).tools.get("t").catch((e) => e);
  assert.ok(error instanceof EnterpriseAIError);
  assert.equal(error.status, 0);
  assert.equal(error.code, "connection_error");
});

test("a read on a kept-alive socket the server closed is sent again on a new one", async () => {
  // The server answers the first request and keeps the connection, then closes it
  // without an answer when the next request arrives on it, as a server whose keep-alive
  // timeout fell at that moment does.
  let requests = 0;
  const server = createServer((req, res) => {
    requests += 1;
    if (requests === 2) {
      req.socket.destroy();
      return;
    }
    res.setHeader("Content-Type", "application/json");
    res.end(JSON.stringify({ name: "t", n: requests }));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = new EnterpriseAI({ baseUrl: `http://127.0.0.1:${server.address().port}`, apiKey: "eai_a_b" });
  try {
    assert.equal((await client.tools.get("t")).n, 1);
    assert.equal((await client.tools.get("t")).n, 3);
    assert.equal(requests, 3); // the failed read was sent again once
  } finally {
    server.closeAllConnections();
    server.close();
  }
});

test("the client refuses a missing URL or key", () => {
  assert.throws(() => new EnterpriseAI({ baseUrl: "ftp://x", apiKey: "k" }), TypeError);
  assert.throws(() => new EnterpriseAI({ baseUrl: "http://x", apiKey: "" }), TypeError);
});
