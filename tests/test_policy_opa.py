"""Decisions through an OPA server (EAI_OPA_URL).

OPA itself cannot run here (no binary in the package registries we reach), so the
server below is a stand-in that speaks OPA's REST data API — `POST /v1/data/<path>`
with `{"input": …}` answering `{"result": …}` — and evaluates the real default policy
with rego-cpp, as OPA would."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings
from regopy import Input, Interpreter

from gateway.models import Decision
from gateway.policy import DEFAULT_POLICY

from .conftest import error_of, scope


class _FakeOpa(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        return

    def _send(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, json.loads(raw)))
        if self.path != "/v1/data/eai/tool/decision":
            self._send(200, {})  # OPA answers an undefined document without "result"
            return
        rego = Interpreter()
        rego.add_module("eai_tool.rego", DEFAULT_POLICY.read_text())
        rego.set_input(Input(json.loads(raw)["input"]))
        result = json.loads(str(rego.query("x := data.eai.tool.decision")))["bindings"]["x"]
        result["policy_version"] = "bundle-7"
        self._send(200, {"result": result})

    def do_GET(self):
        self._send(200, {})


@pytest.fixture
def opa():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpa)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_it_decides_through_opa_when_configured(alice, make_api, opa):
    url = f"http://127.0.0.1:{opa.server_address[1]}"
    with override_settings(EAI_OPA_URL=url):
        body = alice.invoke("jira.search", {"q": "x"}).json()
        assert body["status"] == "succeeded"
        denied = error_of(
            make_api(alice.key.tenant, scopes=["tools:invoke"]).invoke("jira.search", {"q": "x"})
        )
    assert denied["code"] == "policy_denied" and "jira:read" in denied["message"]
    with scope(alice.key.tenant):
        assert Decision.objects.get(pk=body["decision_id"]).policy_version == "opa:bundle-7"
    path, document = opa.requests[0]
    assert path == "/v1/data/eai/tool/decision"
    assert set(document["input"]) == {"principal", "tool", "request", "context"}
    assert document["input"]["principal"]["scopes"] == alice.key.scopes


def test_it_fails_closed_when_opa_is_unreachable(alice):
    with override_settings(EAI_OPA_URL="http://127.0.0.1:9"):
        response = alice.invoke("jira.search", {"q": "x"})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "policy_denied"
    with scope(alice.key.tenant):
        assert Decision.objects.get(pk=error["decision_id"]).policy_version == "error"


def test_the_default_policy_reads_only_what_its_memo_key_holds():
    """Results of the default policy are reused for equal memo keys: that is only right
    while the policy reads nothing else from its input."""
    import re

    read = set(re.findall(r"input\.([a-z_]+(?:\.[a-z_]+)?)", DEFAULT_POLICY.read_text()))
    read |= {
        f"tool.{name}"
        for name in re.findall(r'object\.get\(input\.tool, "([a-z_]+)"', DEFAULT_POLICY.read_text())
    }
    read.discard("tool")  # object.get(input.tool, …) itself
    assert read == {
        "principal.scopes",
        "tool.scopes_required",
        "tool.requires_approval",
        "tool.risk_class",
    }
