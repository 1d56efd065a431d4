// Every TypeScript example of README.md, compiled with tsc against the built package and
// run against the live gateway, as a developer copying it would.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const configPath = process.env.EAI_SDK_TEST_CONFIG;
if (!configPath && process.env.EAI_SDK_REQUIRE === "1") throw new Error("EAI_SDK_TEST_CONFIG is not set: run `make sdk`");

test("the README's examples work when copied", { skip: !configPath && "no live gateway: run `make sdk`" }, () => {
  const config = JSON.parse(readFileSync(configPath, "utf8"));
  const blocks = [...readFileSync(join(root, "README.md"), "utf8").matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.ok(blocks.length > 0);
  blocks.forEach((block, index) => {
    const dir = mkdtempSync(join(tmpdir(), "eai-ts-readme-"));
    mkdirSync(join(dir, "node_modules", "@enterprise-ai"), { recursive: true });
    symlinkSync(root, join(dir, "node_modules", "@enterprise-ai", "sdk"), "dir");
    mkdirSync(join(dir, "node_modules", "@types"), { recursive: true });
    symlinkSync(join(root, "node_modules", "@types", "node"), join(dir, "node_modules", "@types", "node"), "dir");
    writeFileSync(join(dir, "package.json"), '{"type": "module"}\n');
    writeFileSync(join(dir, "example.ts"), block);
    writeFileSync(
      join(dir, "tsconfig.json"),
      JSON.stringify({ compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, skipLibCheck: true, types: ["node"] }, files: ["example.ts"] }),
    );
    execFileSync(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "-p", dir], { stdio: "pipe" });
    const out = execFileSync(process.execPath, [join(dir, "example.js")], {
      env: { ...process.env, EAI_BASE_URL: config.base_url, EAI_API_KEY: config.keys.agent },
      encoding: "utf8",
    });
    assert.ok(out.includes("succeeded") && out.includes("policy_denied"), `example ${index} printed:\n${out}`);
  });
});
