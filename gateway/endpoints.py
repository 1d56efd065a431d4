"""Calling a tool's endpoint: the address guard, `http` over pooled connections, and
`builtin` Python callables.

The seam for every upstream: `call_endpoint()` returns the output or raises
`EndpointError(code, reason)`; tests point tools at real local servers.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from eai.errors import Text
from gateway import builtins

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

_POOL = urllib3.PoolManager(num_pools=64, maxsize=16, retries=False, block=False)


class EndpointError(Exception):
    """An upstream failure. `code` is the invocation error code (tool_error, …)."""

    def __init__(self, code: str, reason: Any, *, status: str = "failed") -> None:
        self.code = code
        self.reason = reason
        self.status = status
        super().__init__(f"{code}: {reason}")


def _as_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:  # legacy IPv4 spellings the resolver accepts: 2852039166, 0xa9.0xfe.0xa9.0xfe
        return ipaddress.ip_address(socket.inet_aton(host))
    except OSError:
        return None


def forbidden_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
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
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return "the URL cannot be parsed"
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


def resolved_refusal(url: str) -> str | None:
    """url_refusal() plus every address the host resolves to (checked at invoke time)."""
    reason = url_refusal(url)
    if reason:
        return reason
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except OSError:
        return None  # unresolvable: the call itself fails as unavailable
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        if forbidden_address(ip):
            return f"{parts.hostname} resolves to a link-local or cloud metadata address"
    return None


def call_endpoint(
    endpoint: dict[str, Any],
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
) -> Any:
    """Run the endpoint with `payload`; return its JSON output or raise EndpointError."""
    kind = endpoint["type"]
    if kind == "http":
        return _call_http(endpoint, payload, headers or {})
    if kind == "builtin":
        return _call_builtin(endpoint, payload)
    raise EndpointError(
        "tool_unavailable",
        Text(_("endpoint type '%(kind)s' is not enabled on this gateway"), kind=kind),
        status="unavailable",
    )


def _call_http(endpoint: dict[str, Any], payload: dict[str, Any], headers: dict[str, str]) -> Any:
    method = endpoint.get("method", "POST")
    timeout_s = endpoint.get("timeout_ms", 30000) / 1000
    send_headers = {"Accept": "application/json", **endpoint.get("headers", {}), **headers}
    url = endpoint["url"]
    body = None
    fields = None
    if method in ("POST", "PUT", "PATCH"):
        body = json.dumps(payload, separators=(",", ":")).encode()
        send_headers["Content-Type"] = "application/json"
    else:
        fields = {k: v if isinstance(v, str) else json.dumps(v) for k, v in payload.items()}
    deadline = time.monotonic() + timeout_s
    try:
        response = _POOL.request(
            method,
            url,
            body=body,
            fields=fields,
            headers=send_headers,
            timeout=urllib3.Timeout(total=timeout_s),
            preload_content=False,
            redirect=False,
        )
        try:
            # Bound what is read: a hostile upstream cannot exhaust memory.
            limit = settings.EAI_MAX_RESULT_BYTES * 64
            raw = response.read(limit + 1, decode_content=True)
        finally:
            response.release_conn()
    except urllib3.exceptions.NewConnectionError as exc:
        # Subclasses ConnectTimeoutError for history's sake, but it is a refusal.
        raise EndpointError(
            "tool_unavailable",
            Text(_("the tool's endpoint could not be reached")),
            status="unavailable",
        ) from exc
    except (urllib3.exceptions.TimeoutError, TimeoutError) as exc:
        raise EndpointError("tool_timeout", "timeout", status="timed_out") from exc
    except urllib3.exceptions.HTTPError as exc:
        if time.monotonic() >= deadline:
            raise EndpointError("tool_timeout", "timeout", status="timed_out") from exc
        raise EndpointError(
            "tool_unavailable",
            Text(_("the tool's endpoint could not be reached")),
            status="unavailable",
        ) from exc
    if len(raw) > limit:
        raise EndpointError("invalid_output", Text(_("the upstream answer is too large")))
    if not 200 <= response.status < 300:
        raise EndpointError(
            "tool_error",
            Text(_("the upstream answered HTTP %(status)s"), status=response.status),
        )
    if b"\\u0000" in raw:  # jsonb cannot store it: refuse the answer, do not fail later
        raise EndpointError("invalid_output", Text(_("the upstream answer holds NUL characters")))
    try:
        return json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise EndpointError("invalid_output", Text(_("the upstream answer is not JSON"))) from exc


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
