"""eai.front: the invoke route served without Django's handler chain answers exactly
as Django does, and every request it should not take reaches Django untouched."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote_to_bytes

import pytest
from django.core import signals
from django.db import close_old_connections
from django.test import RequestFactory

from eai import wsgi
from eai.front import Front

from .conftest import ALL_SCOPES


@contextmanager
def _connections_kept():
    """As Django's test client does: the request signals must not close the test's
    connection (its transaction holds the test's rows)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


class Spy:
    """Django's WSGI application, counting the requests the front hands it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        self.calls += 1
        return wsgi.django_application(environ, start_response)


def _call(app: Any, method: str, path: str, body: bytes, **headers: str) -> tuple:
    environ = (
        RequestFactory()
        .generic(
            method, path, data=body, content_type=headers.pop("content_type", "application/json")
        )
        .environ
    )
    environ.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    # As a WSGI server hands it over: the raw path's bytes read as latin-1.
    environ["PATH_INFO"] = unquote_to_bytes(path).decode("latin-1")
    answer: dict[str, Any] = {}

    def start_response(status: str, header_list: list[tuple[str, str]]) -> None:
        answer["status"] = status
        answer["headers"] = header_list

    with _connections_kept():
        result = app(environ, start_response)
        try:
            content = b"".join(result)
        finally:
            result.close()
    headers_seen = {name.lower(): value for name, value in answer["headers"]}
    if "set-cookie" in headers_seen:  # a new CSRF token is random
        headers_seen["set-cookie"] = re.sub(
            r"csrftoken=[^;]+", "csrftoken=_", headers_seen["set-cookie"]
        )
    assert re.fullmatch(r"req_[0-9a-f]{24}", headers_seen.pop("x-request-id"))
    return answer["status"], headers_seen, content


# Ids and times inside strings too: an MCP result's text block holds the invocation's JSON.
VOLATILE_TEXT = re.compile(r"(req|dec|tinv|apr)_[0-9a-z]+|\d{4}-\d\d-\d\dT[0-9:.+\-]+")


def _comparable(content: bytes) -> Any:
    if not content:
        return content

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return VOLATILE_TEXT.sub("_", value) if isinstance(value, str) else value

    return clean(json.loads(content))


@pytest.fixture
def both(alice):
    spy = Spy()
    front = Front(spy)

    def run(method: str, path: str, body: bytes = b"", **headers: str) -> tuple:
        headers.setdefault("authorization", f"Bearer {alice.raw_key}")
        fast = _call(front, method, path, body, **dict(headers))
        slow = _call(wsgi.django_application, method, path, body, **dict(headers))
        assert fast[0] == slow[0], (fast, slow)
        assert fast[1] == slow[1], (fast, slow)
        assert _comparable(fast[2]) == _comparable(slow[2])
        return fast, spy

    return run


INVOKE = "/v1/tools/jira.search/invoke"
OK = json.dumps({"input": {"q": "INC-42"}}).encode()


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (OK, {}, "200 OK"),
        (OK, {"accept_language": "fr"}, "200 OK"),
        (b'{"input":', {"accept_language": "fr"}, "400 Bad Request"),
        (b'{"input": []}', {}, "400 Bad Request"),
        (b"", {}, "400 Bad Request"),
        (OK, {"authorization": "Bearer eai_nope_nope"}, "401 Unauthorized"),
        (OK, {"authorization": "Basic abc"}, "401 Unauthorized"),
        (OK, {"content_type": "text/plain"}, "415 Unsupported Media Type"),
        (OK, {"accept": "text/html"}, "406 Not Acceptable"),
    ],
)
def test_the_front_answers_as_django(both, body, headers, status):
    (answer_status, answer_headers, _), spy = both("POST", INVOKE, body, **headers)
    assert answer_status == status
    assert spy.calls == 0  # the front served it
    assert answer_headers["x-frame-options"] == "DENY"
    assert answer_headers["vary"] == "Accept-Language"


def test_an_unknown_tool_in_french(both):
    (status, headers, content), spy = both(
        "POST", "/v1/tools/nope/invoke", OK, accept_language="fr-FR,fr;q=0.9"
    )
    assert status == "404 Not Found" and spy.calls == 0
    assert headers["content-language"] == "fr"
    assert json.loads(content)["error"]["code"] == "tool_not_found"


def test_a_denied_call_names_its_decision(both, make_api, tenant_a):
    api = make_api(tenant_a, scopes=[s for s in ALL_SCOPES if s != "tools:invoke"])
    (status, _, content), spy = both("POST", INVOKE, OK, authorization=f"Bearer {api.raw_key}")
    assert status == "403 Forbidden" and spy.calls == 0
    assert json.loads(content)["error"]["decision_id"].startswith("dec_")


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", INVOKE, {}, "405 Method Not Allowed"),
        ("POST", "/v1/tools/jira.search/invoke/", {}, "404 Not Found"),
        ("POST", INVOKE, {"host": "evil.example"}, "400 Bad Request"),
    ],
)
def test_what_the_chain_would_change_goes_to_django(both, method, path, headers, status):
    (answer_status, _, _), spy = both(method, path, OK, **headers)
    assert answer_status == status
    assert spy.calls == 1


def test_a_body_over_the_limit_goes_to_django(both, settings):
    body = b'{"input": {"q": "' + b"x" * settings.EAI_MAX_REQUEST_BYTES + b'"}}'
    (status, _, content), spy = both("POST", INVOKE, body)
    assert status == "413 Request Entity Too Large" and spy.calls == 1
    assert json.loads(content)["error"]["code"] == "payload_too_large"


def test_a_host_not_allowed_gets_the_envelope_in_french(both):
    (status, _, content), spy = both("POST", INVOKE, OK, host="evil.example", accept_language="fr")
    assert status == "400 Bad Request" and spy.calls == 1
    error = json.loads(content)["error"]
    assert error["code"] == "invalid_request"
    assert "en-tête Host" in error["message"] and "Host header" in error["message_i18n"]["en"]


@pytest.mark.parametrize("name", ["%C3%A9t%C3%A9", "%FF", "caf%C3%A9%20x"])
def test_a_tool_name_is_decoded_as_django_decodes_it(both, name):
    (status, _, content), spy = both("POST", f"/v1/tools/{name}/invoke", OK)
    assert status == "404 Not Found" and spy.calls == 0
    assert json.loads(content)["error"]["code"] == "tool_not_found"


def test_a_path_another_route_takes_first_stays_with_django(both):
    """`tools/invocations/<id>` comes before `tools/<name>/invoke` in the URLconf."""
    (status, _, content), spy = both("POST", "/v1/tools/invocations/invoke", OK)
    assert status == "405 Method Not Allowed" and spy.calls == 1
    assert json.loads(content)["error"]["code"] == "method_not_allowed"


def test_a_csrf_cookie_goes_to_django(both):
    (status, headers, _), spy = both("POST", INVOKE, OK, cookie="csrftoken=abc")
    assert status == "200 OK" and spy.calls == 1
    assert "csrftoken=_" in headers["set-cookie"]


def test_a_fallback_gets_the_environ_untouched(both):
    """A non-latin-1 path refused for its host: Django must get the raw PATH_INFO."""
    (status, _, content), spy = both("POST", "/v1/tools/%E2%82%AC/invoke", OK, host="evil.example")
    assert status == "400 Bad Request" and spy.calls == 1
    assert json.loads(content)["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("route", [INVOKE, "/v1/tools/invocations/invoke"])
def test_a_chunked_body_is_read_whole(alice, route, settings):
    """`Transfer-Encoding: chunked` has no Content-Length: the server undoes the chunks,
    and without a length Django would read an empty body ("the body is empty")."""
    import io

    def send(body: bytes) -> tuple:
        environ = (
            RequestFactory()
            .generic("POST", route, data=b"", content_type="application/json")
            .environ
        )
        environ.pop("CONTENT_LENGTH", None)
        environ.update(
            CONTENT_TYPE="application/json",
            HTTP_TRANSFER_ENCODING="chunked",
            HTTP_AUTHORIZATION=f"Bearer {alice.raw_key}",
            **{"wsgi.input": io.BytesIO(body)},
        )
        answer: dict[str, Any] = {}

        def start_response(status: str, header_list: list) -> None:
            answer["status"] = status

        with _connections_kept():
            result = wsgi.application(environ, start_response)
            try:
                content = b"".join(result)
            finally:
                result.close()
        return answer["status"], json.loads(content)

    status, content = send(OK)
    if route == INVOKE:
        assert status == "200 OK" and content["status"] == "succeeded"
    else:
        assert status == "405 Method Not Allowed"
    big = b'{"input": {"q": "' + b"x" * settings.EAI_MAX_REQUEST_BYTES + b'"}}'
    status, content = send(big)
    assert status == "413 Request Entity Too Large"
    assert content["error"]["code"] == "payload_too_large"


MCP = "/v1/mcp"
MCP_CALL = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "jira_search", "arguments": {"q": "INC-42"}},
    }
).encode()


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (MCP_CALL, {"mcp_protocol_version": "2025-11-25"}, "200 OK"),
        (MCP_CALL, {"accept_language": "fr"}, "200 OK"),
        (b"[]", {"accept_language": "fr"}, "400 Bad Request"),
        (b'{"jsonrpc":', {}, "400 Bad Request"),
        (b'{"jsonrpc": "2.0", "method": "notifications/initialized"}', {}, "202 Accepted"),
        (MCP_CALL, {"authorization": "Bearer eai_nope_nope"}, "401 Unauthorized"),
        (MCP_CALL, {"content_type": "text/plain"}, "415 Unsupported Media Type"),
        (MCP_CALL, {"origin": "https://evil.example"}, "403 Forbidden"),
    ],
)
def test_the_front_answers_mcp_as_django(both, body, headers, status):
    (answer_status, answer_headers, _), spy = both("POST", MCP, body, **headers)
    assert answer_status == status
    assert spy.calls == 0  # the front served it
    assert answer_headers["x-frame-options"] == "DENY"


def test_mcp_get_goes_to_django(both):
    (status, headers, _), spy = both("GET", MCP)
    assert status == "405 Method Not Allowed" and spy.calls == 1
    assert headers["allow"] == "POST"
