"""Shared fixtures: two tenants (Alice's `acme`, Bob's `globex`) with the same tools,
keys for each, an API client speaking HTTP through Django's test client, and real
local upstream servers for `http` tools."""

from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from gateway import demo
from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from tenants.models import Tenant
from tenants.scope import tenant_scope

ALL_SCOPES = [
    "tools:invoke",
    "tools:read",
    "invocations:read",
    "audit:read",
    "events:read",
    "contracts:validate",
    "manifests:apply",
    "finops:read",
    "finops:write",
    "jira:read",
    "payments:write",
]

SECRET_TOOL = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {"name": "secret.tool", "version": "1.0.0"},
    "spec": {
        "input_schema": {"type": "object"},
        "endpoint": {"type": "builtin", "callable": "echo"},
        "scopes_required": ["secret:read"],
    },
}


def tool_manifest(name: str, endpoint: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "eai/v1",
        "kind": "Tool",
        "metadata": {"name": name, "version": spec.pop("version", "1.0.0")},
        "spec": {
            "input_schema": spec.pop("input_schema", {"type": "object"}),
            "endpoint": endpoint,
            **spec,
        },
    }


def echo_manifest(name: str, input_schema: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A builtin echo tool checked against `input_schema`."""
    return tool_manifest(
        name, {"type": "builtin", "callable": "echo"}, input_schema=input_schema, **spec
    )


def scope(tenant: Tenant):
    """Read or write `tenant`'s rows from a test, as the tenant's own code does: its
    models' managers answer only inside a tenant scope (no transaction of its own on
    SQLite, where the test's transaction holds everything)."""
    return tenant_scope(tenant, readonly=True)


def seed_tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.create(slug=slug, name=slug.title())
    apply_manifests(
        tenant=tenant, documents=[demo.JIRA_SEARCH, demo.PAYMENTS_TRANSFER, SECRET_TOOL]
    )
    return tenant


class Api:
    """A JSON API client for one key (None: no Authorization header)."""

    def __init__(self, raw_key: str | None) -> None:
        self.client = Client()
        self.raw_key = raw_key

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        out = {}
        if self.raw_key is not None:
            out["Authorization"] = f"Bearer {self.raw_key}"
        out.update(headers or {})
        return out

    def get(self, path: str, headers: dict[str, str] | None = None, **params: Any):
        return self.client.get(path, params, headers=self._headers(headers))

    def post(
        self,
        path: str,
        body: Any = None,
        *,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ):
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return self.client.post(
            path, data=data, content_type=content_type, headers=self._headers(headers)
        )

    def invoke(
        self,
        tool: str,
        tool_input: Any = None,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ):
        body = {"input": {} if tool_input is None else tool_input, **fields}
        return self.post(f"/v1/tools/{tool}/invoke", body, headers=headers)


@pytest.fixture
def tenant_a(db) -> Tenant:
    return seed_tenant("acme")


@pytest.fixture
def tenant_b(db) -> Tenant:
    return seed_tenant("globex")


@pytest.fixture(autouse=True)
def _fresh_process_caches():
    """Each test starts with the per-process caches of keys and tools empty, as a new
    worker would: what one test cached must not answer for the next."""
    from gateway import pipeline
    from tenants.models import forget_cached_keys

    forget_cached_keys()
    pipeline._tool_cache.clear()
    yield


@pytest.fixture(autouse=True)
def _own_anchor_log(settings, tmp_path):
    """Each test appends its audit checkpoints to an anchor log of its own."""
    settings.EAI_AUDIT_ANCHOR_PATH = str(tmp_path / "audit-anchors.jsonl")


@pytest.fixture
def make_api(db):
    def make(tenant: Tenant, scopes: list[str] | None = None, agent: str = "agent-1", **kw):
        key, raw = issue_api_key(
            tenant=tenant, scopes=ALL_SCOPES if scopes is None else scopes, agent=agent, **kw
        )
        api = Api(raw)
        api.key = key
        return api

    return make


@pytest.fixture
def alice(tenant_a, make_api) -> Api:
    """Alice's agent in tenant acme, holding every scope."""
    return make_api(tenant_a, agent="alice-agent")


@pytest.fixture
def bob(tenant_b, make_api) -> Api:
    """Bob's agent in tenant globex, holding every scope."""
    return make_api(tenant_b, agent="bob-agent")


def error_of(response) -> dict[str, Any]:
    """The envelope's `error`, after checking the envelope's shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"code", "message", "message_i18n", "details", "request_id"} <= set(error), error
    assert set(error["message_i18n"]) == {"en", "fr"}
    assert error["request_id"].startswith("req_")
    return error


# ------------------------------------------------------------------ upstream


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        self.server.calls.append(
            {
                "method": method,
                "path": parts.path,
                "query": parse_qs(parts.query),
                "body": raw,
                "headers": dict(self.headers),
                "client": self.client_address,  # one per connection: shows keep-alive
            }
        )
        route = parts.path
        if route == "/echo":
            payload = (
                json.loads(raw) if raw else {k: v[0] for k, v in parse_qs(parts.query).items()}
            )
            self._send(200, json.dumps({"method": method, "got": payload}).encode())
        elif route == "/headers":  # echoes what it was sent, as a careless upstream would
            self._send(200, json.dumps({"headers": dict(self.headers)}).encode())
        elif route.startswith("/status/"):
            self._send(int(route.rsplit("/", 1)[1]), b'{"error": "upstream says no"}')
        elif route == "/slow":
            time.sleep(float(parse_qs(parts.query).get("s", ["2"])[0]))
            self._send(200, b'{"late": true}')
        elif route == "/nan":
            self._send(200, b'{"score": NaN, "max": Infinity}')
        elif route == "/nul":
            self._send(200, b'{"text": "a\\u0000b"}')
        elif route == "/refs":  # a structured result, as the agent tool protocol has them
            self._send(
                200,
                json.dumps(
                    {
                        "object_refs": [{"type": "ticket", "id": "INC-42"}],
                        "observations": ["two matches"],
                        "provenance_refs": ["src:jira"],
                        "artifacts": "not a list",
                    }
                ).encode(),
            )
        elif route == "/surrogate":  # valid JSON syntax, not writable as UTF-8
            self._send(200, b'{"text": "a\\ud800b"}')
        elif route == "/deep":
            self._send(200, b"[" * 5000 + b"]" * 5000)
        elif route == "/huge-float":  # reads as infinity
            self._send(200, b'{"x": 1e400}')
        elif route == "/notjson":
            self._send(200, b"<html>hello</html>", "text/html")
        elif route == "/big":
            self._send(200, json.dumps({"blob": "x" * 300_000}).encode())
        elif route == "/shape":
            self._send(200, b'{"count": "not a number"}')
        elif route == "/chunked":  # Transfer-Encoding: chunked, in three chunks
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b'{"parts": ', b'["a", "b"]', b"}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif route == "/gzip":  # compressed although the gateway asks for identity
            body = gzip.compress(b'{"zipped": true}')
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif route == "/drip":  # headers at once, then a byte every 0.1 s for 3 s
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "32")
            self.end_headers()
            try:
                for _ in range(30):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
                self.wfile.write(b"{}")
            except OSError:
                pass
        elif route == "/eof":  # no Content-Length, not chunked: the body ends at close
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b'{"until": "eof"}')
        elif route == "/hints":  # a 103 Early Hints before the answer
            self.send_response_only(103)
            self.send_header("Link", "</style.css>; rel=preload")
            self.end_headers()
            self._send(200, b'{"after": "hints"}')
        elif route == "/double":  # two answers in one write, as a confused upstream might
            one = b'{"n": 1}'
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(one), one) * 2
            )
        elif route == "/endless-headers":  # headers that never end (a hostile upstream)
            self.close_connection = True
            self.send_response(200)
            try:
                for index in range(4000):
                    self.send_header(f"X-Pad-{index}", "x" * 100)
                self.end_headers()
            except OSError:
                pass
        elif route == "/upgrade":  # switches protocols instead of answering
            self.close_connection = True
            self.wfile.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\n\r\n"
            )
        elif route == "/close":  # answers, then closes the connection
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "13")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b'{"closed": 1}')
        else:
            self._send(404, b'{"error": "no route"}')

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")


@pytest.fixture
def upstream():
    """A real HTTP upstream on 127.0.0.1 (random port); `.url(path)`, `.calls`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    server.calls = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = lambda path: f"http://127.0.0.1:{server.server_address[1]}{path}"
    yield server
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------------ SDK


@pytest.fixture
def sdk_tenants(transactional_db):
    a, b = seed_tenant("acme"), seed_tenant("globex")
    scopes = [
        "tools:invoke",
        "tools:read",
        "invocations:read",
        "audit:read",
        "jira:read",
        "payments:write",
    ]
    _, raw_a = issue_api_key(tenant=a, scopes=scopes, agent="sdk-agent")
    _, raw_b = issue_api_key(tenant=b, scopes=scopes, agent="sdk-agent")
    return raw_a, raw_b


@pytest.fixture
def sdk_server(live_server, sdk_tenants) -> tuple[str, str]:
    return live_server.url, sdk_tenants[0]


@pytest.fixture
def sdk_server_other(live_server, sdk_tenants) -> tuple[str, str]:
    return live_server.url, sdk_tenants[1]


@pytest.fixture
def high_socket_pair():
    """(a socket numbered 1100, its peer): select() cannot watch descriptors from 1024
    up, poll() can. Skipped where the process may not open that many."""
    import os
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the process may not open descriptors over 1024 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    here, there = socket.socketpair()
    high = socket.socket(fileno=os.dup2(here.fileno(), 1100))
    try:
        yield high, there
    finally:
        for sock in (high, here, there):
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def tamper(tenant: Tenant, sql: str, params: list[Any]) -> None:
    """Edit a tenant's stored audit rows behind the application's back, as the tables'
    owner could: its append-only trigger switched off for the statement, the tenant's
    rows in scope (row-level security applies to the owner too: FORCE)."""
    from django.db import connection  # noqa: PLC0415

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant.pk)])
            # ALTER TABLE waits for no deferred check: run the test's pending ones now.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(
                "ALTER TABLE gateway_auditevent DISABLE TRIGGER gateway_auditevent_append_only"
            )
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE gateway_auditevent ENABLE TRIGGER gateway_auditevent_append_only"
            )
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
