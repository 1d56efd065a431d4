// The CommonJS build loads with require() and carries the same classes.
const { test } = require("node:test");
const assert = require("node:assert/strict");
const sdk = require("../dist/cjs/index.js");

test("require() gives the client and the error class", () => {
  const client = new sdk.EnterpriseAI({ baseUrl: "http://127.0.0.1:1", apiKey: "eai_a_b" });
  assert.equal(client.mcpUrl, "http://127.0.0.1:1/v1/mcp");
  assert.equal(typeof sdk.EnterpriseAIError, "function");
  assert.match(sdk.newIdempotencyKey(), /^sdk-ts-[0-9a-f]{32}$/);
});
