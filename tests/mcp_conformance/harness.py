"""The MCP project's own conformance suite against `/v1/mcp` (`.ci/mcp-conformance`).

Serves the gateway as `make run` does (`manage.py serve`, SQLite in a scratch folder),
seeds a `conformance` tenant whose builtin tools are the suite's fixtures, and runs the
pinned `@modelcontextprotocol/conformance` (Node 22, fetched by npx) once per protocol
revision, each with its exact expected-failure file. The suite sends no credentials, so
it talks to a small loopback proxy that adds the tenant's test key: the product itself
has no keyless path. Exits non-zero when a check fails that its file does not list, or a
listed one passes (the files can only shrink).
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
HOST = "127.0.0.1"
PACKAGE = "@modelcontextprotocol/conformance@0.2.0-alpha.12"
NODE = "node@22"  # the suite calls fs.globSync (Node 22 and later)
REVISIONS = ("2025-11-25", "2026-07-28")

SEED = """
from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from tenants.models import Tenant

def tool(name, description, **spec):
    return {
        "apiVersion": "eai/v1",
        "kind": "Tool",
        "metadata": {"name": name, "version": "1.0.0", "description": description},
        "spec": {
            "input_schema": spec.pop("input_schema", {"type": "object"}),
            "endpoint": {"type": "builtin", "callable": "echo"},
            "idempotent": True,
            **spec,
        },
    }

tenant = Tenant.objects.create(slug="conformance", name="Conformance")
apply_manifests(tenant=tenant, documents=[
    tool("test_simple_text", "Answers one text block"),
    # The echo's object breaks this output schema: the call fails, as the fixture must.
    tool("test_error_handling", "Always fails", output_schema={"type": "array"}),
    tool("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features", input_schema={
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {"address": {"$anchor": "addressDef", "type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}}}},
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}},
               "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": False,
    }),
    # An argument mirrored in an `Mcp-Param-Region` header (2026-07-28, SEP-2243).
    tool("test_custom_headers", "Echoes a region", input_schema={
        "type": "object",
        "required": ["region"],
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
    }),
])
_key, raw = issue_api_key(
    tenant=tenant, scopes=["tools:read", "tools:invoke", "invocations:read"], agent="conformance"
)
print("CONFORMANCE_KEY " + raw)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def proxy(target_port: int, key: str) -> ThreadingHTTPServer:
    """A loopback proxy to the gateway that adds `Authorization: Bearer <key>` when the
    request has none; everything else (Host and Origin included) passes as sent."""

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            if not any(k.lower() == "authorization" for k in headers):
                headers["Authorization"] = f"Bearer {key}"
            upstream = http.client.HTTPConnection(HOST, target_port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                upstream.close()

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_OPTIONS = do_HEAD = _forward

    server = ThreadingHTTPServer((HOST, 0), Forward)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_healthy(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the gateway exited early")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit("the gateway did not become healthy in 60 s")


def run_suite(url: str, revision: str, out: Path) -> int:
    expected = HERE / f"expected-failures-{revision}.yml"
    argv = [
        *("npx", "--yes", "-p", NODE, "-p", PACKAGE, "conformance", "server"),
        *("--url", url, "--suite", "all", "--spec-version", revision),
        *("--expected-failures", str(expected), "-o", str(out / revision)),
    ]
    print(f"\n== conformance {revision}: {' '.join(argv)}", flush=True)
    return subprocess.run(argv, cwd=ROOT, timeout=1800).returncode


def main() -> int:
    if shutil.which("npx") is None:
        print("npx not found: install Node.js (npm) to run the MCP conformance suite")
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="eai-mcp-conformance-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAI_", "DJANGO_"))}
    env.update(
        EAI_SQLITE_PATH=str(scratch / "db.sqlite3"),
        EAI_SECRET_KEY="conformance-only-secret-key-0123456789abcdefghijklmnopqrstuv",
        EAI_ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True
    )
    seeded = subprocess.run(
        [PYTHON, "manage.py", "shell"],
        cwd=ROOT,
        env=env,
        input=SEED,
        capture_output=True,
        text=True,
        check=True,
    )
    key = next(
        line.split()[1]
        for line in seeded.stdout.splitlines()
        if line.startswith("CONFORMANCE_KEY ")
    )
    port = free_port()
    log = open(scratch / "gateway.log", "wb")  # noqa: SIM115 (closed with the process)
    gateway = subprocess.Popen(
        [PYTHON, "manage.py", "serve", "--bind", f"{HOST}:{port}"],
        cwd=ROOT,
        env={**env, "EAI_DEMO_UPSTREAM_PORT": str(free_port())},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    forward = None
    try:
        wait_healthy(port, gateway)
        forward = proxy(port, key)
        url = f"http://{HOST}:{forward.server_address[1]}/v1/mcp"
        failed = [r for r in REVISIONS if run_suite(url, r, scratch) != 0]
    finally:
        if forward is not None:
            forward.shutdown()
        os.killpg(gateway.pid, signal.SIGTERM)
        gateway.wait(30)
        log.close()
    print(f"\nresults and the gateway's log in {scratch}")
    if failed:
        print(f"MCP conformance FAILED for {', '.join(failed)} (see the checks above)")
        return 1
    print("MCP conformance: every check as its expected-failure file says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
