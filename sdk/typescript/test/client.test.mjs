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

test("the client refuses a missing URL or key", () => {
  assert.throws(() => new EnterpriseAI({ baseUrl: "ftp://x", apiKey: "k" }), TypeError);
  assert.throws(() => new EnterpriseAI({ baseUrl: "http://x", apiKey: "" }), TypeError);
});
