"""End-to-end tests of the Python SDK (``sdk/python``) over real HTTP.

The fixtures ``sdk_server`` and ``sdk_server_other`` (``tests/conftest.py``) return
``(base_url, api_key)`` for two seeded tenants whose catalogs hold ``jira.search``,
``payments.transfer`` (requires approval) and ``secret.tool`` (scope the key lacks).
"""

from __future__ import annotations

import http.server
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
from enterprise_ai import (
    APIConnectionError,
    AuthenticationError,
    EnterpriseAI,
    EnterpriseAIError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ToolError,
    ValidationError,
)


def _run_id() -> str:
    return f"run_sdk{uuid.uuid4().hex[:16]}"


def _tool_name(row: dict) -> str | None:
    tool = row.get("tool")
    return tool.get("name") if isinstance(tool, dict) else tool


@pytest.fixture
def client(sdk_server) -> Iterator[EnterpriseAI]:
    base_url, api_key = sdk_server
    with EnterpriseAI(base_url=base_url, api_key=api_key, timeout=30.0) as c:
        yield c


@pytest.fixture
def other_client(sdk_server_other) -> Iterator[EnterpriseAI]:
    base_url, api_key = sdk_server_other
    with EnterpriseAI(base_url=base_url, api_key=api_key, timeout=30.0) as c:
        yield c


def test_it_invoke_succeeds_and_echoes_run(client: EnterpriseAI) -> None:
    run_id = _run_id()
    inv = client.tools.invoke("jira.search", {"q": "INC-42"}, run_id=run_id, step_index=4)
    assert inv["status"] == "succeeded"
    assert inv["invocation_id"].startswith("tinv_")
    assert inv["run_id"] == run_id
    assert inv["step_index"] == 4
    assert isinstance(inv["output"]["issues"], list)
    assert inv["decision_id"].startswith("dec_")


def test_it_invocations_get_list_and_iter(client: EnterpriseAI) -> None:
    run_id = _run_id()
    first = client.tools.invoke("jira.search", {"q": "INC-1"}, run_id=run_id, step_index=0)
    second = client.tools.invoke("jira.search", {"q": "INC-2"}, run_id=run_id, step_index=1)
    ids = {first["invocation_id"], second["invocation_id"]}

    got = client.invocations.get(first["invocation_id"])
    assert got["invocation_id"] == first["invocation_id"]
    assert got["status"] == "succeeded"

    page = client.invocations.list(tool="jira.search", run_id=run_id, limit=500)
    assert set(page) >= {"results", "next_cursor"}
    assert ids <= {row["invocation_id"] for row in page["results"]}
    assert all(_tool_name(row) == "jira.search" for row in page["results"])

    one = client.invocations.list(run_id=run_id, limit=1)
    assert len(one["results"]) == 1
    assert one["next_cursor"]

    rows = list(client.invocations.iter(run_id=run_id, limit=1))
    assert len(rows) == 2
    assert {r["invocation_id"] for r in rows} == ids


def test_it_approval_is_not_an_error_and_can_be_cancelled(client: EnterpriseAI) -> None:
    inv = client.tools.invoke(
        "payments.transfer",
        {"iban": "FR7630006000011234567890189", "amount": "12.50"},
        run_id=_run_id(),
        step_index=0,
    )
    assert inv["status"] == "waiting_approval"
    assert inv["approval_id"].startswith("apr_")
    assert inv["invocation_id"].startswith("tinv_")

    cancelled = client.invocations.cancel(inv["invocation_id"])
    assert cancelled["status"] == "cancelled"
    assert client.invocations.get(inv["invocation_id"])["status"] == "cancelled"


def test_it_policy_denied_has_decision(client: EnterpriseAI) -> None:
    with pytest.raises(PermissionDeniedError) as info:
        client.tools.invoke("secret.tool", {})
    err = info.value
    assert err.status == 403
    assert err.code == "policy_denied"
    assert err.decision_id and err.decision_id.startswith("dec_")
    assert err.request_id
    assert set(err.message_i18n) >= {"en", "fr"}

    decision = client.decisions.get(err.decision_id)
    assert err.decision_id in (decision.get("decision_id"), decision.get("id"))


def test_it_invalid_input(client: EnterpriseAI) -> None:
    with pytest.raises(ValidationError) as info:
        client.tools.invoke("jira.search", {"query": "missing q"})
    assert info.value.code == "invalid_input"
    assert info.value.status == 400
    assert info.value.details


def test_it_unknown_tool(client: EnterpriseAI) -> None:
    with pytest.raises(NotFoundError) as info:
        client.tools.invoke("no.such.tool", {"q": "x"})
    assert info.value.code == "tool_not_found"
    assert info.value.status == 404


def test_it_bad_key(sdk_server) -> None:
    base_url, _ = sdk_server
    bad = EnterpriseAI(base_url=base_url, api_key="eai_nope_nope")
    with bad, pytest.raises(AuthenticationError) as info:
        bad.tools.list()
    assert info.value.code == "unauthenticated"
    assert info.value.status == 401


def test_it_french_messages(sdk_server) -> None:
    base_url, api_key = sdk_server
    fr = EnterpriseAI(base_url=base_url, api_key=api_key, language="fr")
    with fr, pytest.raises(NotFoundError) as info:
        fr.tools.invoke("no.such.tool", {"q": "x"})
    err = info.value
    assert err.message == err.message_i18n["fr"]
    assert err.message != err.message_i18n["en"]


def test_it_other_tenant_cannot_see_invocation(
    client: EnterpriseAI, other_client: EnterpriseAI
) -> None:
    inv = client.tools.invoke("jira.search", {"q": "INC-9"})
    with pytest.raises(NotFoundError) as info:
        other_client.invocations.get(inv["invocation_id"])
    assert info.value.code == "not_found"
    assert info.value.status == 404


def test_it_idempotency_key_replays(client: EnterpriseAI) -> None:
    key = f"sdk-{uuid.uuid4().hex}"
    run_id = _run_id()
    first = client.tools.invoke("jira.search", {"q": "INC-7"}, run_id=run_id, idempotency_key=key)
    again = client.tools.invoke("jira.search", {"q": "INC-7"}, run_id=run_id, idempotency_key=key)
    assert again["invocation_id"] == first["invocation_id"]


def test_it_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    c = EnterpriseAI(base_url=f"http://127.0.0.1:{port}", api_key="eai_a_b", timeout=5)
    with c, pytest.raises(APIConnectionError) as info:
        c.tools.list()
    assert info.value.status is None
    assert isinstance(info.value, EnterpriseAIError)


# -- transport behaviour against a tiny local server (no gateway needed) --------------------


class _RawHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: list[tuple[str, int]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        type(self).peers.append(self.client_address)
        if self.path.startswith("/v1/tools/html"):
            self._send(502, b"<html>Bad Gateway</html>", "text/html", {})
        elif self.path.startswith("/v1/tools/slow"):
            self._send(
                429,
                b'{"error": {"code": "rate_limited", "message": "Slow down."}}',
                "application/json",
                {"Retry-After": "7"},
            )
        else:
            self._send(200, b'{"results": [], "next_cursor": null}', "application/json", {})


@pytest.fixture
def raw_server() -> Iterator[str]:
    _RawHandler.peers = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RawHandler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_sdk_non_json_error_and_retry_after(raw_server: str) -> None:
    with EnterpriseAI(base_url=raw_server, api_key="eai_a_b") as c:
        with pytest.raises(ToolError) as info:
            c.tools.get("html")
        assert info.value.code == "http_error"
        assert info.value.status == 502
        with pytest.raises(RateLimitError) as limited:
            c.tools.get("slow")
        assert limited.value.retry_after == 7
        assert limited.value.code == "rate_limited"


def test_sdk_reuses_connection(raw_server: str) -> None:
    with EnterpriseAI(base_url=raw_server, api_key="eai_a_b") as c:
        for _ in range(3):
            assert c.tools.list() == {"results": [], "next_cursor": None}
    assert len(set(_RawHandler.peers)) == 1


def test_the_sdk_sees_a_kept_connection_numbered_over_1023_alive(high_socket_pair):
    """An application with many files open: select() cannot watch such a socket, and
    the SDK would reconnect for every call."""
    import http.client

    from enterprise_ai._transport import _connection_dropped

    high, there = high_socket_pair
    conn = http.client.HTTPConnection("127.0.0.1")
    conn.sock = high
    assert _connection_dropped(conn) is False
    there.close()
    assert _connection_dropped(conn) is True
