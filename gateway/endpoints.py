"""Calling a tool's endpoint: the address guard, `http` over pooled connections, and
`builtin` Python callables.

The seam for every upstream: `call_endpoint()` returns the output or raises
`EndpointError(code, reason)`; tests point tools at real local servers.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import select
import socket
import ssl
import threading
import time
import zlib
from typing import Any
from urllib.parse import urlencode, urlsplit

import httptools
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from eai.errors import Text
from eai.parsers import JSONInvalid, finite_float, json_depth_exceeds, text_problem
from gateway import builtins
from gateway import sandbox as sandboxes

# Cloud metadata services, by name and address (AWS, GCP, Azure, Alibaba, Oracle, …).
METADATA_HOSTS = {
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "metadata.azure.internal",
    "instance-data",
    "instance-data.ec2.internal",
}
METADATA_ADDRESSES = {
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("169.254.170.2"),
    ipaddress.ip_address("100.100.100.200"),
    ipaddress.ip_address("192.0.0.192"),
    ipaddress.ip_address("fd00:ec2::254"),
}


class EndpointError(Exception):
    """An upstream failure. `code` is the invocation error code (tool_error, …)."""

    def __init__(self, code: str, reason: Any, *, status: str = "failed") -> None:
        self.code = code
        self.reason = reason
        self.status = status
        super().__init__(f"{code}: {reason}")


def _as_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    host = host.strip("[]").rstrip(".")  # "169.254.169.254." resolves as the address
    try:
        return ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        pass
    try:  # legacy IPv4 spellings the resolver accepts: 2852039166, 0xa9.0xfe.0xa9.0xfe
        return ipaddress.ip_address(socket.inet_aton(host))
    except OSError:
        return None


# Prefixes whose last 32 bits are an IPv4 address: NAT64 (well-known and local-use,
# RFC 8215) and SIIT's IPv4-translated addresses (::ffff:0:a.b.c.d).
_EMBEDDING = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("::ffff:0:0:0/96"),
)


def forbidden_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address inside an IPv6 one reaches that IPv4 host: mapped (::ffff:a.b.c.d),
        # compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4 (2002:aabb:ccdd::), Teredo.
        inner = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
        packed = ip.packed
        if packed[:12] == bytes(12) or any(ip in net for net in _EMBEDDING):
            inner.append(ipaddress.IPv4Address(packed[12:]))
        if ip in _EMBEDDING[1]:  # the local-use /48 may embed by RFC 6052's other layouts
            for layout in (packed[6:8] + packed[9:11], packed[7:8] + packed[9:12], packed[9:13]):
                inner.append(ipaddress.IPv4Address(layout))
        # Embedded: the link-local and metadata addresses (zero padding reads 0.0.0.0,
        # which counts only where it is this host: ::ffff:0.0.0.0).
        if any(v4 is not None and (v4.is_link_local or v4 in METADATA_ADDRESSES) for v4 in inner):
            return True
        if ip.ipv4_mapped is not None and ip.ipv4_mapped.is_unspecified:
            return True
    return ip.is_link_local or ip in METADATA_ADDRESSES or ip.is_unspecified


def host_allowed(host: str) -> bool:
    """Whether EAI_ALLOWED_TOOL_HOSTS (when set) admits `host` (exact or `*.suffix`)."""
    allowed = settings.EAI_ALLOWED_TOOL_HOSTS
    if not allowed:
        return True
    host = host.lower()
    for pattern in allowed:
        pattern = pattern.lower()
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
        if host == pattern:
            return True
    return False


def url_refusal(url: str) -> str | None:
    """Why `url` may not be a tool endpoint (from its text alone), or None."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 (raises ValueError for "abc" or 99999)
    except ValueError:
        return "the URL cannot be parsed (host or port)"
    if not host:
        return "the URL has no host"
    if host.rstrip(".") in METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    ip = _as_ip(host)
    if ip is not None and forbidden_address(ip):
        return f"{host} is a link-local or cloud metadata address"
    if not host_allowed(host):
        return f"{host} is not in EAI_ALLOWED_TOOL_HOSTS"
    return None


Address = tuple[int, int, int, str, Any]  # one getaddrinfo() answer


class Vetted:
    """What `vet()` found for a URL: why it may not be called (`refusal`), else the
    addresses its host resolved to, every one checked (`addresses`; None for an address
    literal, which is connected to as written). The call connects to these and to
    nothing else: resolving the name again to connect let a DNS answer that changed in
    between (a rebinding name: a public address, then 169.254.169.254) reach an address
    nobody vetted."""

    __slots__ = ("refusal", "addresses")

    def __init__(self, refusal: str | None, addresses: tuple[Address, ...] | None) -> None:
        self.refusal = refusal
        self.addresses = addresses


def vet(url: str) -> Vetted:
    """url_refusal() plus every address the host resolves to, at invoke time."""
    checked = _text_check(url, tuple(settings.EAI_ALLOWED_TOOL_HOSTS or ()))
    if checked is not _RESOLVE:
        return Vetted(checked, None)  # type: ignore[arg-type]
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(
            parts.hostname, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError:
        return Vetted(None, ())  # unresolvable: the call itself fails as unavailable
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if forbidden_address(ip):
            return Vetted(
                f"{parts.hostname} resolves to a link-local or cloud metadata address", None
            )
    return Vetted(None, tuple(infos))


def resolved_refusal(url: str) -> str | None:
    """Why `url` may not be called now (`vet()`'s refusal), or None."""
    return vet(url).refusal


_RESOLVE = object()  # the host is a name: look its addresses up on every call


@functools.lru_cache(maxsize=4096)
def _text_check(url: str, allowed: tuple[str, ...]) -> str | object | None:
    """url_refusal(), memoized per URL (and allow list); `_RESOLVE` when the URL passes
    and its host is a name. An address literal has nothing more to resolve. A name is
    resolved on every call, so a DNS answer that changes to a forbidden address is
    still caught."""
    reason = url_refusal(url)
    if reason:
        return reason
    host = urlsplit(url).hostname or ""
    return None if _as_ip(host) is not None else _RESOLVE


def call_endpoint(
    endpoint: dict[str, Any],
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    vetted: Vetted | None = None,
    sandbox: dict[str, Any] | None = None,
    definition: dict[str, Any] | None = None,
) -> Any:
    """Run the endpoint with `payload`; return its JSON output or raise EndpointError.
    An `http` endpoint is connected to at the addresses `vetted` holds (`vet()` of its
    URL; vetted here when not given); `sandbox` carries a sandbox endpoint's resolved
    profile, tenant and environment; `definition` an `mcp` tool's reviewed upstream
    definition (its outputSchema)."""
    kind = endpoint["type"]
    if kind == "http":
        if vetted is None:
            vetted = vet(endpoint["url"])
        if vetted.refusal:
            raise EndpointError("endpoint_forbidden", vetted.refusal, status="denied")
        return _call_http(endpoint, payload, headers or {}, vetted.addresses)
    if kind == "builtin":
        return _call_builtin(endpoint, payload)
    if kind == "sandbox" and sandbox is not None:
        try:
            raw = sandboxes.run(endpoint, payload, **sandbox)
        except sandboxes.SandboxError as exc:
            raise EndpointError(exc.code, exc.reason, status=exc.status) from exc
        # Parsed as an upstream's answer is: a tool's stdout is no more trusted.
        return parse_answer(raw)
    if kind == "mcp":
        return _call_mcp(endpoint, payload, headers or {}, definition)
    raise EndpointError(
        "tool_unavailable",
        Text(_("endpoint type '%(kind)s' is not enabled on this gateway"), kind=kind),
        status="unavailable",
    )


class _Connections(threading.local):
    """Idle keep-alive sockets to upstreams, per thread, keyed by scheme, host and port.

    Requests are written in one send and answers parsed by httptools (llhttp, the
    parser of Node.js, as uvicorn uses it): measured on the invoke path, the standard
    library's client spent 0.3 ms of CPU a call, mostly in its e-mail header parser.
    """

    def __init__(self) -> None:
        # key -> (socket, when it went idle)
        self.idle: dict[tuple[str, str, int], tuple[socket.socket, float]] = {}

    def take(
        self,
        scheme: str,
        host: str,
        port: int,
        timeout: float,
        addresses: tuple[Address, ...] | None,
    ) -> socket.socket:
        """A kept socket (connected earlier to a vetted address), else a new one to
        `addresses` (None: `host` is an address literal, connected to as written). TLS
        names `host`: its server name (SNI) and the certificate checked against it."""
        kept = self.idle.pop((scheme, host, port), None)
        if kept is not None:
            sock, since = kept
            if time.monotonic() - since <= MAX_IDLE_S and not _dropped(sock):
                return sock
            sock.close()
        if addresses is None:
            sock = socket.create_connection((host, port), timeout=max(timeout, 0.001))
        else:
            sock = _connect(addresses, max(timeout, 0.001))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme == "https":
            sock = _tls().wrap_socket(sock, server_hostname=host)
        return sock

    def give_back(self, scheme: str, host: str, port: int, sock: socket.socket) -> None:
        old = self.idle.pop((scheme, host, port), None)
        if old is not None:
            old[0].close()
        if len(self.idle) >= 64:  # bounded: close the oldest
            self.idle.pop(next(iter(self.idle)))[0].close()
        self.idle[(scheme, host, port)] = (sock, time.monotonic())


def _connect(addresses: tuple[Address, ...], timeout: float) -> socket.socket:
    """A TCP connection to the first of `addresses` that accepts, in resolver order (as
    socket.create_connection tries them, without resolving anything)."""
    error: OSError = OSError("the endpoint's name resolved to no address")
    deadline = time.monotonic() + timeout
    for family, kind, proto, _name, sockaddr in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


# A kept socket idle longer than this is closed rather than reused. Servers close idle
# connections on their own clock (gunicorn after 2 s, uvicorn and Node.js after 5 s): a
# close that crosses our request on the wire would fail a call that never reached the
# tool, and a call that is not idempotent cannot be sent again. Busy upstreams keep
# their sockets; a quiet one costs a new connection.
MAX_IDLE_S = 1.0


_CONNECTIONS = _Connections()


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle keep-alive socket was closed (or sent junk) by the upstream.
    poll(), not select(): select() refuses descriptors from 1024 up, which a busy
    server reaches, and every kept socket would then look dropped."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _unreachable() -> EndpointError:
    return EndpointError(
        "tool_unavailable",
        Text(_("the tool's endpoint could not be reached")),
        status="unavailable",
    )


class _Answer:
    """httptools callbacks: one response's status, headers and (bounded) body."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parser = httptools.HttpResponseParser(self)
        self.reset()

    def reset(self) -> None:
        self.extra = False  # a second message after the answer: do not reuse the socket
        self.encoding: str | None = None
        self.framed = False  # Content-Length or chunked: the end is known without EOF
        self.chunks: list[bytes] = []
        self.size = 0
        self.headers_done = False
        self.done = False
        self.keep_alive = False

    def on_message_begin(self) -> None:
        if self.done:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.done:
            return
        name = name.lower()
        if name == b"content-encoding":
            self.encoding = value.decode("latin-1")
        elif name in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.done:
            return
        self.size += len(body)
        if self.size <= self.limit + 1:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self.parser.get_status_code() < 200:  # 1xx (103 Early Hints): the answer follows
            self.reset()
            return
        self.done = True
        # Read here: once this callback returns, llhttp resets the message's flags and
        # should_keep_alive() answers False whatever the upstream said.
        self.keep_alive = self.parser.should_keep_alive()

    @property
    def too_large(self) -> bool:
        return self.size > self.limit


def _request_bytes(
    method: str, target: str, netloc: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    if _UNSAFE_TARGET_RE.search(target) or _UNSAFE_TARGET_RE.search(netloc):
        raise _invalid_request_line()
    lines = [f"{method} {target} HTTP/1.1", f"Host: {netloc}", "Accept-Encoding: identity"]
    for name, value in headers.items():
        if not FIELD_NAME_RE.match(name) or any(c in str(value) for c in "\r\n\0"):
            raise _invalid_request_line()
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise _invalid_request_line() from exc
    return head + body if body is not None else head


# An RFC 9110 field name (token), to its very end: `$` would let "X\n" through.
FIELD_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_UNSAFE_TARGET_RE = re.compile(r"[\x00-\x20\x7f]")  # no header or request smuggling


def _invalid_request_line() -> EndpointError:
    return EndpointError(
        "tool_unavailable",
        Text(_("the tool's endpoint address or headers are not valid")),
        status="unavailable",
    )


def _call_http(
    endpoint: dict[str, Any],
    payload: dict[str, Any],
    headers: dict[str, str],
    addresses: tuple[Address, ...] | None,
) -> Any:
    method = endpoint.get("method", "POST")
    timeout_s = endpoint.get("timeout_ms", 30000) / 1000
    deadline = time.monotonic() + timeout_s
    send_headers = {"Accept": "application/json", **endpoint.get("headers", {}), **headers}
    parts = urlsplit(endpoint["url"])
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    target = parts.path or "/"
    query = parts.query
    body = None
    if method in ("POST", "PUT", "PATCH"):
        body = json.dumps(payload, separators=(",", ":")).encode()
        send_headers["Content-Type"] = "application/json"
    else:  # the input goes as query parameters, JSON-encoded when not a string
        fields = urlencode(
            {k: v if isinstance(v, str) else json.dumps(v) for k, v in payload.items()}
        )
        query = f"{query}&{fields}" if query and fields else query or fields
    if query:
        target = f"{target}?{query}"
    request = _request_bytes(method, target, parts.netloc.rpartition("@")[2], send_headers, body)
    limit = settings.EAI_MAX_RESULT_BYTES * 64  # a hostile upstream cannot exhaust memory
    answer = _Answer(limit)
    sock = None
    try:
        sock = _CONNECTIONS.take(scheme, host, port, deadline - time.monotonic(), addresses)
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(request)
        _read_answer(sock, answer, deadline)
    except EndpointError:
        _close(sock)
        raise
    except TimeoutError as exc:
        _close(sock)
        raise EndpointError("tool_timeout", "timeout", status="timed_out") from exc
    except (OSError, httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
        _close(sock)
        if time.monotonic() >= deadline:
            raise EndpointError("tool_timeout", "timeout", status="timed_out") from exc
        raise _unreachable() from exc
    if answer.too_large:
        _close(sock)
        raise EndpointError("invalid_output", Text(_("the upstream answer is too large")))
    if answer.done and not answer.extra and answer.keep_alive:
        _CONNECTIONS.give_back(scheme, host, port, sock)
    else:
        _close(sock)
    status = answer.parser.get_status_code()
    raw = _decoded(b"".join(answer.chunks), answer.encoding, limit)
    if not 200 <= status < 300:
        raise EndpointError(
            "tool_error",
            Text(_("the upstream answered HTTP %(status)s"), status=status),
        )
    return parse_answer(raw)


def parse_answer(raw: bytes) -> Any:
    """An endpoint's JSON answer (an upstream's body, a sandboxed tool's stdout), held to
    what a request must be: no NUL, NaN or Infinity, lone surrogate or endless nesting."""
    if b"\\u0000" in raw:  # jsonb cannot store it: refuse the answer, do not fail later
        raise EndpointError("invalid_output", Text(_("the upstream answer holds NUL characters")))
    if not raw.strip():
        return None
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=finite_float)
    except (_NonFinite, JSONInvalid) as exc:  # NaN, Infinity, or a number read as infinity
        # Python reads them, JSON has no such numbers: no encoder downstream would keep them.
        reason = Text(_("the upstream answer holds NaN or Infinity, which JSON does not allow"))
        raise EndpointError("invalid_output", reason) from exc
    except RecursionError as exc:
        raise _too_deep() from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise EndpointError("invalid_output", Text(_("the upstream answer is not JSON"))) from exc
    # What a request may not carry, an answer may not either: it is stored, scrubbed and
    # sent on (a lone surrogate cannot be written as UTF-8; 5,000 levels overflow).
    if json_depth_exceeds(value, settings.EAI_MAX_JSON_DEPTH):
        raise _too_deep()
    problem = text_problem(value, raw)
    if problem is not None:
        raise EndpointError("invalid_output", problem)
    return value


def _too_deep() -> EndpointError:
    return EndpointError(
        "invalid_output",
        Text(
            _("the upstream answer is nested deeper than %(limit)s levels"),
            limit=settings.EAI_MAX_JSON_DEPTH,
        ),
    )


class _NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NonFinite(name)


MAX_HEADER_BYTES = 64 * 1024  # status line and headers; endless headers are refused


def _read_answer(sock: socket.socket, answer: _Answer, deadline: float) -> None:
    """Feed the parser until the answer is complete, too large, or the deadline passes
    (checked between reads, so a slow-dripping upstream cannot run past it)."""
    head = 0  # bytes read before the headers ended: bounded like http.client's
    while not answer.done and not answer.too_large:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed while reading the answer")
        sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            if answer.headers_done and not answer.framed:
                answer.done = True  # the body runs to the end of the connection
                return
            raise ConnectionResetError("the upstream closed the connection mid-answer")
        if not answer.headers_done:
            head += len(data)
            if head > MAX_HEADER_BYTES + 65536:  # + one read that may carry body too
                raise EndpointError("invalid_output", Text(_("the upstream answer is too large")))
        answer.parser.feed_data(data)


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()


def _decoded(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo a gzip or deflate Content-Encoding (we ask for identity; some send it
    anyway), bounded like the raw body."""
    if not encoding or encoding.strip().lower() in ("identity", ""):
        return raw
    wbits = {"gzip": 31, "x-gzip": 31, "deflate": 15}.get(encoding.strip().lower())
    if wbits is None:
        raise EndpointError("invalid_output", Text(_("the upstream answer is not JSON")))
    try:
        decoder = zlib.decompressobj(wbits)
        out = decoder.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise EndpointError("invalid_output", Text(_("the upstream answer is not JSON"))) from exc
    if len(out) > limit:
        raise EndpointError("invalid_output", Text(_("the upstream answer is too large")))
    return out


def _call_mcp(
    endpoint: dict[str, Any],
    payload: dict[str, Any],
    headers: dict[str, str],
    definition: dict[str, Any] | None,
) -> Any:
    """A tool on an MCP server, through the official SDK's client (gateway.mcp_client).
    Its output is held to what an http tool's answer is held to."""
    from gateway import mcp_client

    try:
        output = mcp_client.call_tool(
            endpoint,
            payload,
            headers=headers,
            output_schema=(definition or {}).get("outputSchema"),
        )
    except mcp_client.MCPCallError as exc:
        raise EndpointError(exc.code, exc.reason, status=exc.status) from exc
    if json_depth_exceeds(output, settings.EAI_MAX_JSON_DEPTH):
        raise _too_deep()
    try:  # ASCII: NUL and lone surrogates show as escapes, which text_problem looks for
        raw = json.dumps(output, allow_nan=False)
    except ValueError as exc:
        reason = Text(_("the upstream answer holds NaN or Infinity, which JSON does not allow"))
        raise EndpointError("invalid_output", reason) from exc
    if len(raw) > settings.EAI_MAX_RESULT_BYTES * 64:
        raise EndpointError("invalid_output", Text(_("the upstream answer is too large")))
    problem = text_problem(output, raw)
    if problem is not None:
        raise EndpointError("invalid_output", problem)
    return output


def _call_builtin(endpoint: dict[str, Any], payload: dict[str, Any]) -> Any:
    func = builtins.REGISTRY.get(endpoint["callable"])
    if func is None:
        raise EndpointError(
            "tool_unavailable",
            Text(_("the builtin callable is not registered")),
            status="unavailable",
        )
    try:
        return func(payload)
    except builtins.BuiltinError as exc:
        raise EndpointError("tool_error", str(exc)) from exc
