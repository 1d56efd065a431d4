// The shared behaviours of sdk/scenarios.json against a live gateway (`make sdk`).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { EnterpriseAI, EnterpriseAIError } from "../dist/esm/index.js";

const configPath = process.env.EAI_SDK_TEST_CONFIG;
if (!configPath && process.env.EAI_SDK_REQUIRE === "1") throw new Error("EAI_SDK_TEST_CONFIG is not set: run `make sdk`");
const config = configPath ? JSON.parse(readFileSync(configPath, "utf8")) : null;
const scenarios = config ? JSON.parse(readFileSync(config.scenarios, "utf8")).scenarios : [];

const client = (key, options = {}) => new EnterpriseAI({ baseUrl: config.base_url, apiKey: config.keys[key], ...options });
const fill = (text) => text.replaceAll("{lang}", "typescript").replaceAll("{nonce}", randomBytes(4).toString("hex"));

async function refusedWith(promise, want) {
  const error = await promise.then(
    () => assert.fail("no error"),
    (e) => e,
  );
  assert.ok(error instanceof EnterpriseAIError, String(error));
  if (want.status !== undefined) assert.equal(error.status, want.status, error.message);
  if (want.code !== undefined) assert.equal(error.code, want.code);
  if (want.decision_id_prefix) assert.ok(error.decision_id?.startsWith(want.decision_id_prefix));
  if (want.request_id_prefix) assert.ok(error.request_id?.startsWith(want.request_id_prefix));
  if (want.message_contains) assert.ok(error.message.includes(want.message_contains), error.message);
  if (want.message_i18n_en_contains) assert.ok(error.message_i18n.en.includes(want.message_i18n_en_contains));
  assert.ok("en" in error.message_i18n && "fr" in error.message_i18n);
  return error;
}

const runners = {
  async invoke_masks_iban(s) {
    const inv = await client(s.key).tools.invoke(s.tool, { arguments: s.input, run_id: fill(s.run_id) });
    assert.equal(inv.status, s.expect.status);
    assert.ok(inv.invocation_id.startsWith(s.expect.invocation_id_prefix));
    assert.ok(JSON.stringify(inv.output).includes(s.expect.output_contains));
    assert.ok(!JSON.stringify(inv).includes(s.expect.output_not_contains));
  },
  async policy_denied(s) {
    await refusedWith(client(s.key).tools.invoke(s.tool, { arguments: s.input }), s.expect_error);
  },
  async tool_not_found(s) {
    await refusedWith(client(s.key).tools.invoke(s.tool, { arguments: s.input }), s.expect_error);
  },
  async parked_then_wait(s) {
    const agent = client(s.key);
    const parked = await agent.tools.invoke(s.tool, { arguments: s.input });
    assert.equal(parked.status, s.expect.status);
    assert.ok(parked.approval_id?.startsWith(s.expect.approval_id_prefix));
    await client(s.approve.key).approvals.decide(parked.approval_id, { verdict: s.approve.verdict, reason: s.approve.reason });
    const final = await agent.invocations.wait(parked.invocation_id, s.wait_seconds * 1000);
    assert.equal(final.status, s.expect_after_wait.status);
  },
  async idempotent_replay_and_conflict(s) {
    const c = client(s.key);
    const key = fill(s.idempotency_key);
    const first = await c.tools.invoke(s.tool, { arguments: s.input, idempotency_key: key });
    const again = await c.tools.invoke(s.tool, { arguments: s.input, idempotency_key: key });
    assert.equal(again.invocation_id, first.invocation_id);
    await refusedWith(c.tools.invoke(s.tool, { arguments: s.conflict_input, idempotency_key: key }), s.expect_error_on_conflict);
  },
  async rate_limited_then_success(s) {
    const noRetry = client(s.key, { maxRetries: 0 });
    let limited = null;
    for (let i = 0; i < 3 && !limited; i++) {
      try {
        await noRetry.tools.invoke(s.tool, { arguments: s.input });
      } catch (error) {
        limited = error;
      }
    }
    assert.ok(limited, "three calls in a row were never rate limited");
    await refusedWith(Promise.reject(limited), s.expect_error_without_retry);
    assert.ok(limited.retry_after >= s.expect_error_without_retry.retry_after_min_seconds);
    const retrying = client(s.key, { maxRetries: 3 });
    for (let i = 0; i < 2; i++) {
      const inv = await retrying.tools.invoke(s.tool, { arguments: s.input });
      assert.equal(inv.status, s.expect_with_retry.status);
    }
  },
  async pagination(s) {
    const c = client(s.key);
    const runId = fill(s.run_id);
    const made = new Set();
    for (let i = 0; i < s.calls; i++) made.add((await c.tools.invoke(s.tool, { arguments: s.input, run_id: runId, step_index: i })).invocation_id);
    let pages = 0;
    let cursor;
    do {
      const page = await c.invocations.list({ run_id: runId, limit: s.page_size, cursor });
      pages++;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
    const seen = [];
    for await (const row of c.invocations.iter({ run_id: runId, limit: s.page_size })) seen.push(row.invocation_id);
    assert.equal(seen.length, s.expect.count);
    assert.deepEqual(new Set(seen), made);
    assert.ok(pages >= s.expect.min_pages);
  },
  async french_message(s) {
    await refusedWith(client(s.key, { language: s.language }).tools.invoke(s.tool, { arguments: s.input }), s.expect_error);
  },
  async cross_tenant_not_found(s) {
    const inv = await client(s.key).tools.invoke(s.tool, { arguments: s.input });
    await refusedWith(client(s.other_key).invocations.get(inv.invocation_id), s.expect_error);
  },
};

test("every scenario of sdk/scenarios.json is implemented", { skip: !config && "no live gateway: run `make sdk`" }, () => {
  assert.ok(scenarios.length > 0);
  for (const s of scenarios) assert.ok(runners[s.id], `scenario ${s.id} is not implemented by the TypeScript SDK`);
});

for (const s of scenarios) {
  test(`scenario ${s.id}`, async () => {
    await runners[s.id](s);
  });
}
