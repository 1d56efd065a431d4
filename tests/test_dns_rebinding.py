"""The outbound HTTP client connects to the addresses it vetted, never to a second
resolution of the name: a rebinding name answers a harmless address to the check and
the metadata address to the connection. The URL's host stays the Host header, the TLS
server name (SNI) and the name the certificate is checked against.

The resolver is replaced at its seam (`socket.getaddrinfo`), and every connection
attempt to anything but loopback is refused and recorded, so no test sends a packet
off this machine even when the client is wrong."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from http.server import ThreadingHTTPServer

import pytest

from gateway import endpoints
from gateway.endpoints import EndpointError, call_endpoint
from gateway.manifests import apply_manifests

from .conftest import _Upstream, tool_manifest

METADATA = "169.254.169.254"
_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect


class Rebinding:
    """A resolver for names under `.rebind.test`: loopback the first time each is
    asked, the metadata address every time after; other names resolve as usual."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.attempts: list[str] = []

    def getaddrinfo(self, host, port, *args, **kwargs):
        if not isinstance(host, str) or not host.endswith(".rebind.test"):
            return _real_getaddrinfo(host, port, *args, **kwargs)
        self.asked[host] = self.asked.get(host, 0) + 1
        address = "127.0.0.1" if self.asked[host] == 1 else METADATA
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    def connect(self, sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            self.attempts.append(address[0])
            if not ipaddress.ip_address(address[0].split("%")[0]).is_loopback:
                raise ConnectionRefusedError(f"test guard: no connection to {address[0]}")
        return _real_connect(sock, address)


@pytest.fixture
def rebinding(monkeypatch):
    resolver = Rebinding()
    monkeypatch.setattr(socket, "getaddrinfo", resolver.getaddrinfo)
    monkeypatch.setattr(
        socket.socket, "connect", lambda sock, address: resolver.connect(sock, address)
    )
    endpoints._CONNECTIONS.idle.clear()  # a kept socket would skip the connection
    yield resolver
    endpoints._CONNECTIONS.idle.clear()


def test_an_invoke_connects_only_to_the_vetted_address(alice, bob, upstream, rebinding):
    port = upstream.server_address[1]
    url = f"http://api.rebind.test:{port}/headers"
    for tenant in (alice.key.tenant, bob.key.tenant):
        apply_manifests(
            tenant=tenant,
            documents=[tool_manifest("rebound", {"type": "http", "url": url, "method": "GET"})],
        )
    response = alice.invoke("rebound", {})
    assert response.status_code == 200, response.content
    assert rebinding.attempts == ["127.0.0.1"]
    assert rebinding.asked == {"api.rebind.test": 1}  # resolved once: vetted and used
    assert response.json()["output"]["headers"]["Host"] == f"api.rebind.test:{port}"
    # Bob's call resolves on its own (and, the name now rebound, is refused).
    endpoints._CONNECTIONS.idle.clear()
    refused = bob.invoke("rebound", {})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "endpoint_forbidden"
    assert METADATA not in rebinding.attempts


def test_a_direct_call_vets_before_it_connects(upstream, rebinding):
    port = upstream.server_address[1]
    endpoint = {"type": "http", "url": f"http://direct.rebind.test:{port}/echo"}
    assert call_endpoint(endpoint, {"a": 1}) == {"method": "POST", "got": {"a": 1}}
    endpoints._CONNECTIONS.idle.clear()
    with pytest.raises(EndpointError) as refused:
        call_endpoint(endpoint, {"a": 1})
    assert refused.value.code == "endpoint_forbidden"
    assert rebinding.attempts == ["127.0.0.1"]


def _certificates(tmp_path, name: str) -> tuple[str, str, str]:
    """A CA and a server certificate for `name` it signed: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, public_key, signing_key, *, ca: bool, san: str | None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        if san:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False
            )
        return builder.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("test CA", "test CA", ca_key.public_key(), ca_key, ca=True, san=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build(name, "test CA", key.public_key(), ca_key, ca=False, san=name)
    paths = [tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return tuple(str(p) for p in paths)  # type: ignore[return-value]


@pytest.fixture
def tls_upstream(tmp_path, monkeypatch):
    """An HTTPS upstream on loopback with a certificate for `tls.rebind.test`, whose CA
    the gateway's client trusts for the test; `.server_names` records SNI."""
    ca, cert, key = _certificates(tmp_path, "tls.rebind.test")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    server.calls = []
    server.server_names = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda _sock, name, _ctx: server.server_names.append(name)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = ssl.create_default_context(cafile=ca)
    monkeypatch.setattr(endpoints, "_tls", lambda: client)
    yield server
    server.shutdown()
    server.server_close()


def test_tls_names_the_urls_host_and_checks_its_certificate(tls_upstream, rebinding):
    port = tls_upstream.server_address[1]
    endpoint = {"type": "http", "url": f"https://tls.rebind.test:{port}/headers"}
    output = call_endpoint(endpoint, {})
    assert output["headers"]["Host"] == f"tls.rebind.test:{port}"
    assert tls_upstream.server_names == ["tls.rebind.test"]
    assert rebinding.attempts == ["127.0.0.1"]
    # A name the certificate does not hold fails the check, at the vetted address.
    wrong = {"type": "http", "url": f"https://other.rebind.test:{port}/headers"}
    with pytest.raises(EndpointError) as failed:
        call_endpoint(wrong, {})
    assert failed.value.code == "tool_unavailable"
    assert tls_upstream.server_names == ["tls.rebind.test", "other.rebind.test"]
    assert rebinding.attempts == ["127.0.0.1", "127.0.0.1"]


def _forget_mcp_connections():
    """Close the MCP client's pooled connections: the next call must connect anew."""
    from gateway import mcp_client

    async def drop():
        while mcp_client._LOOP.clients:
            _key, client = mcp_client._LOOP.clients.popitem()
            await client.aclose()

    mcp_client.run(drop, 5)


def test_an_mcp_endpoint_connects_only_to_an_address_checked_when_connecting(alice, monkeypatch):
    """The MCP SDK's HTTP client resolves the name itself, after the pipeline's `vet()`:
    a name that answers loopback to the check and the metadata address to the SDK's
    connection reaches nothing, and the call is refused as `endpoint_forbidden`."""
    from .mcp_upstream import Upstream

    answers: list[str] = []
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, bytes):  # anyio asks with the IDNA-encoded name
            host = host.decode("ascii")
        if not isinstance(host, str) or not host.endswith(".rebind.test"):
            return _real_getaddrinfo(host, port, *args, **kwargs)
        asked.append(host)
        address = answers.pop(0) if answers else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    resolver = Rebinding()
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(
        socket.socket, "connect", lambda sock, address: resolver.connect(sock, address)
    )
    server = Upstream(any_host=True)
    try:
        url = f"http://mcp.rebind.test:{server.port}/mcp"
        endpoint = {"type": "mcp", "url": url, "tool": "lookup"}
        apply_manifests(tenant=alice.key.tenant, documents=[tool_manifest("crm.mcp", endpoint)])
        _forget_mcp_connections()
        ok = alice.invoke("crm.mcp", {"customer_id": "C7"})
        assert ok.status_code == 200, ok.content  # a name that keeps its answer works
        _forget_mcp_connections()
        answers[:] = ["127.0.0.1", METADATA]  # vet() sees loopback, the SDK the metadata
        asked.clear()
        refused = alice.invoke("crm.mcp", {"customer_id": "C7"})
        assert refused.status_code == 403, refused.content
        error = refused.json()["error"]
        assert error["code"] == "endpoint_forbidden"
        assert len(asked) == 2  # the pipeline's check, then the connection's own
        assert METADATA not in resolver.attempts
        assert set(resolver.attempts) == {"127.0.0.1"}
    finally:
        _forget_mcp_connections()
        server.stop()
