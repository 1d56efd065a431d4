"""The demo: its manifests, its small HTTP upstream, and the seed `manage.py demo` runs.

The upstream stands for an internal CRM on 127.0.0.1 (`make run` starts it beside the
portal); its answers hold personal data on purpose, as real tools' answers do.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JIRA_SEARCH = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {"name": "jira.search", "version": "1.0.0", "description": "Search Jira issues"},
    "spec": {
        "input_schema": {
            "type": "object",
            "required": ["q"],
            "properties": {"q": {"type": "string", "minLength": 1, "maxLength": 500}},
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "required": ["issues"],
            "properties": {"issues": {"type": "array"}},
        },
        "endpoint": {"type": "builtin", "callable": "demo.jira_search", "timeout_ms": 5000},
        "scopes_required": ["jira:read"],
        "cost": {"amount": "0.001", "currency": "EUR"},
        "risk_class": "low",
        "action_class": "read",
        "idempotent": True,
    },
}

PAYMENTS_TRANSFER = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {
        "name": "payments.transfer",
        "version": "1.0.0",
        "description": "Order a SEPA credit transfer",
    },
    "spec": {
        "input_schema": {
            "type": "object",
            "required": ["iban", "amount"],
            "properties": {
                "iban": {"type": "string", "minLength": 15, "maxLength": 42},
                "amount": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,2})?$"},
                "currency": {"type": "string", "enum": ["EUR"]},
                "reference": {"type": "string", "maxLength": 140},
            },
            "additionalProperties": False,
        },
        "endpoint": {"type": "builtin", "callable": "demo.payments_transfer"},
        "scopes_required": ["payments:write"],
        "requires_approval": True,
        "approval": {"min_approvers": 1, "expires_in": "1h"},
        "cost": {"amount": "0.05", "currency": "EUR"},
        "risk_class": "high",
        "action_class": "payment",
        "idempotent": False,
        # The bank needs the real IBAN: stored and shown masked, sent unaltered.
        "dlp": {"input": "allow", "output": "mask"},
    },
}


HR_PAYROLL = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {
        "name": "hr.payroll",
        "version": "1.0.0",
        "description": "Read an employee's payslips (needs the hr:read scope)",
    },
    "spec": {
        "input_schema": {
            "type": "object",
            "required": ["employee_id"],
            "properties": {"employee_id": {"type": "string", "maxLength": 64}},
            "additionalProperties": False,
        },
        "endpoint": {"type": "builtin", "callable": "echo"},
        # The demo agent's key does not hold it: calling this tool shows a policy denial
        # with its recorded decision.
        "scopes_required": ["hr:read"],
        "risk_class": "medium",
        "action_class": "read",
        "idempotent": True,
    },
}


# A sandboxed tool: a small Python program over its input, run under bubblewrap with the
# built-in `strict` profile (no network, its own empty /tmp, bounded memory and time).
REPORT_SUMMARY_SCRIPT = """
import json, sys
rows = json.load(sys.stdin)["rows"]
total = sum(float(r.get("amount", 0)) for r in rows)
print(json.dumps({"rows": len(rows), "total": f"{total:.2f}",
                  "largest": max(rows, key=lambda r: float(r.get("amount", 0)), default=None)}))
"""

REPORT_SUMMARY = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {
        "name": "report.summary",
        "version": "1.0.0",
        "description": "Summarise rows of amounts (a Python program in a sandbox)",
    },
    "spec": {
        "input_schema": {
            "type": "object",
            "required": ["rows"],
            "properties": {
                "rows": {"type": "array", "maxItems": 10000, "items": {"type": "object"}}
            },
            "additionalProperties": False,
        },
        "endpoint": {
            "type": "sandbox",
            "command": ["/usr/bin/python3", "-I", "-c", REPORT_SUMMARY_SCRIPT],
            "timeout_ms": 10000,
        },
        "sandbox_profile": "strict",
        "scopes_required": ["reports:run"],
        "risk_class": "low",
        "action_class": "execute",
        "idempotent": True,
    },
}


def crm_lookup_manifest(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "eai/v1",
        "kind": "Tool",
        "metadata": {
            "name": "crm.lookup",
            "version": "1.0.0",
            "description": "Look a customer up in the CRM (HTTP tool)",
        },
        "spec": {
            "input_schema": {
                "type": "object",
                "required": ["customer_id"],
                "properties": {"customer_id": {"type": "string", "pattern": "^C[0-9]{1,9}$"}},
                "additionalProperties": False,
            },
            "endpoint": {
                "type": "http",
                "url": f"http://127.0.0.1:{port}/crm/lookup",
                "method": "POST",
                "timeout_ms": 3000,
            },
            "scopes_required": ["crm:read"],
            "cost": {"amount": "0.002", "currency": "EUR"},
            "idempotent": True,
            "network": "internal",
        },
    }


def manifests(port: int) -> list[dict[str, Any]]:
    return [JIRA_SEARCH, PAYMENTS_TRANSFER, HR_PAYROLL, REPORT_SUMMARY, crm_lookup_manifest(port)]


def kb_search_manifest(mcp_port: int) -> dict[str, Any]:
    """The MCP-backed demo tool: `kb_search` on the demo MCP server. Its definition is
    read and pinned at apply; `manage.py mcp_resync` closes it if it changes."""
    return {
        "apiVersion": "eai/v1",
        "kind": "Tool",
        "metadata": {
            "name": "kb.search",
            "version": "1.0.0",
            "description": "Search the support knowledge base (a tool on an MCP server)",
        },
        "spec": {
            "input_schema": {
                "type": "object",
                "required": ["query"],
                "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
                "additionalProperties": False,
            },
            "endpoint": {
                "type": "mcp",
                "url": f"http://127.0.0.1:{mcp_port}/mcp",
                "tool": "kb_search",
                "timeout_ms": 5000,
            },
            "scopes_required": ["kb:read"],
            "cost": {"amount": "0.001", "currency": "EUR"},
            "idempotent": True,
            "network": "internal",
        },
    }


def build_mcp_server() -> Any:
    """The demo knowledge base as an MCP server (the official SDK's own server)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("demo-kb")

    @server.tool(description="Search support articles by words", structured_output=True)
    def kb_search(query: str) -> dict[str, Any]:
        words = query.lower().split()
        found = [a for a in KB_ARTICLES if any(w in a["title"].lower() for w in words)]
        return {"query": query, "articles": found or KB_ARTICLES[:1]}

    return server


KB_ARTICLES = [
    {
        "id": "KB-1",
        "title": "Refund a card payment",
        # Personal data on purpose, as real answers hold: the gateway masks it.
        "body": "Escalate to refunds@acme.example; test IBAN FR76 3000 6000 0112 3456 7890 189.",
    },
    {"id": "KB-2", "title": "Reset a customer password", "body": "Use the self-service page."},
]


class McpUpstream:
    """The demo MCP server under uvicorn on a daemon thread (stateless, JSON replies)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        import socket

        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # OSError when the port is taken: the caller decides
        app = build_mcp_server().streamable_http_app(stateless_http=True, json_response=True)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="demo-mcp", daemon=True
        )
        self.thread.start()
        import time

        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


AGENT_SCOPES = [
    "kb:read",
    "tools:invoke",
    "tools:read",
    "invocations:read",
    "events:read",
    "audit:read",
    "jira:read",
    "payments:write",
    "crm:read",
    "reports:run",
]


class _UpstreamHandler(BaseHTTPRequestHandler):
    """The demo CRM: POST /crm/lookup and POST /echo, JSON in and out."""

    server_version = "demo-crm/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            payload = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": "bad json"})
            return
        if self.path == "/echo":
            self._send(200, payload)
        elif self.path == "/crm/lookup":
            customer = str(payload.get("customer_id", "C0"))
            self._send(
                200,
                {
                    "customer_id": customer,
                    "name": "Camille Martin",
                    "email": "camille.martin@example.fr",
                    "phone": "+33 6 12 34 56 78",
                    "iban": "FR76 3000 6000 0112 3456 7890 189",
                    "segment": "retail",
                },
            )
        else:
            self._send(404, {"error": "not found"})


def start_upstream(port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve the demo upstream on a daemon thread; returns the server (for shutdown)."""
    server = ThreadingHTTPServer((host, port), _UpstreamHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="demo-upstream", daemon=True)
    thread.start()
    return server
