"""`http` endpoints: wire format, failures, timeouts and refused addresses, against a
real upstream server on 127.0.0.1."""

import time

import pytest

from gateway.manifests import apply_manifests
from gateway.models import Invocation, Tool
from tenants.scope import tenant_scope

from .conftest import error_of, scope, tool_manifest


def add_tool(api, name, url, **spec):
    endpoint = {"type": "http", "url": url, **spec.pop("endpoint", {})}
    apply_manifests(tenant=api.key.tenant, documents=[tool_manifest(name, endpoint, **spec)])


def test_it_posts_the_input_as_json_and_returns_the_upstream_body(alice, upstream):
    add_tool(alice, "echo", upstream.url("/echo"), idempotent=True)
    response = alice.invoke("echo", {"msg": "hello", "n": 2})
    assert response.status_code == 200, response.content
    assert response.json()["output"] == {"method": "POST", "got": {"msg": "hello", "n": 2}}
    call = upstream.calls[-1]
    assert call["headers"]["Content-Type"] == "application/json"
    assert "Authorization" not in call["headers"]  # the agent's key never goes upstream


def test_it_sends_get_input_as_query_parameters(alice, upstream):
    add_tool(alice, "echo.get", upstream.url("/echo"), endpoint={"method": "GET"})
    body = alice.invoke("echo.get", {"city": "Lyon", "days": 3}).json()
    assert body["output"] == {"method": "GET", "got": {"city": "Lyon", "days": "3"}}
    assert upstream.calls[-1]["body"] == b""


def test_it_fails_a_non_2xx_answer_as_tool_error(alice, upstream):
    add_tool(alice, "broken", upstream.url("/status/500"))
    response = alice.invoke("broken", {})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "tool_error"
    assert "500" in error["message"]
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=error["invocation_id"])
    assert stored.status == "failed" and stored.error["code"] == "tool_error"
    assert stored.finished_at is not None


def test_it_fails_a_non_json_answer_as_invalid_output(alice, upstream):
    add_tool(alice, "html", upstream.url("/notjson"))
    response = alice.invoke("html", {})
    assert response.status_code == 502
    assert error_of(response)["code"] == "invalid_output"


def test_it_fails_an_output_schema_violation_as_invalid_output(alice, upstream):
    add_tool(
        alice,
        "shape",
        upstream.url("/shape"),
        output_schema={"type": "object", "properties": {"count": {"type": "integer"}}},
    )
    response = alice.invoke("shape", {})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "invalid_output"
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "failed"


def test_it_times_out_within_the_tool_timeout(alice, upstream):
    add_tool(alice, "slow", upstream.url("/slow?s=3"), endpoint={"timeout_ms": 300})
    started = time.monotonic()
    response = alice.invoke("slow", {})
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    error = error_of(response)
    assert error["code"] == "tool_timeout"
    assert "300" in error["message"]
    assert elapsed < 2.0
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "timed_out"
    assert len([c for c in upstream.calls if c["path"] == "/slow"]) == 1  # never retried


def test_it_answers_unavailable_when_the_upstream_is_down(alice):
    add_tool(alice, "down", "http://127.0.0.1:9/nothing")
    response = alice.invoke("down", {})
    assert response.status_code == 503
    error = error_of(response)
    assert error["code"] == "tool_unavailable"
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "unavailable"


def test_it_bounds_large_outputs_and_keeps_the_full_body(alice, upstream):
    from gateway.models import Artifact

    add_tool(alice, "big", upstream.url("/big"))
    body = alice.invoke("big", {}).json()
    assert body["status"] == "succeeded"
    assert body["output"]["truncated"] is True
    with scope(alice.key.tenant):
        artifact = Artifact.objects.get(pk=body["output"]["artifact_ref"])
    assert artifact.size > 300_000 and artifact.invocation_id == body["invocation_id"]
    # the result names it, and the owner's tenant can fetch it whole
    assert body["artifacts"] == [
        {"artifact_ref": artifact.id, "kind": "full_output", "size_bytes": artifact.size}
    ]
    assert body["object_refs"] == body["observations"] == body["provenance_refs"] == []
    assert body["diagnostic"] is None
    full = alice.get(f"/v1/artifacts/{artifact.id}")
    assert full.status_code == 200 and full["Content-Type"] == "application/json"
    assert full.json() == {"blob": "x" * 300_000}


def test_an_artifact_is_fetched_only_in_its_tenant_with_the_read_scope(
    alice, bob, make_api, upstream
):
    add_tool(alice, "big", upstream.url("/big"))
    ref = alice.invoke("big", {}).json()["output"]["artifact_ref"]
    assert error_of(bob.get(f"/v1/artifacts/{ref}"))["code"] == "not_found"
    assert error_of(alice.get("/v1/artifacts/art_nope"))["code"] == "not_found"
    no_scope = make_api(alice.key.tenant, scopes=["tools:invoke"])
    assert error_of(no_scope.get(f"/v1/artifacts/{ref}"))["code"] == "insufficient_scope"


def test_a_result_carries_the_references_its_tool_returned(alice, upstream):
    add_tool(alice, "refs", upstream.url("/echo"), idempotent=True)
    refs = {
        "object_refs": [{"type": "ticket", "id": "INC-42"}],
        "observations": ["two matches"],
        "provenance_refs": ["src:jira"],
        "artifacts": "not a list",  # ignored: only lists are references
    }
    body = alice.invoke("refs", refs).json()
    assert body["object_refs"] == [] and body["output"]["got"] == refs  # nested: not lifted
    add_tool(alice, "refs.top", upstream.url("/refs"), idempotent=True)
    body = alice.invoke("refs.top", {}).json()
    assert body["object_refs"] == [{"type": "ticket", "id": "INC-42"}]
    assert body["observations"] == ["two matches"] and body["provenance_refs"] == ["src:jira"]
    assert body["artifacts"] == []
    add_tool(alice, "broken", upstream.url("/status/500"))
    failed = alice.invoke("broken", {})
    stored = alice.get(f"/v1/tools/invocations/{error_of(failed)['invocation_id']}").json()
    assert stored["diagnostic"] == stored["error"]["message"]
    assert "500" in stored["diagnostic"]


@pytest.mark.django_db(transaction=True)
def test_it_commits_a_running_claim_before_calling_a_non_idempotent_tool(alice, upstream):
    add_tool(alice, "slowpost", upstream.url("/slow?s=0.5"), endpoint={"timeout_ms": 5000})
    import threading

    seen = {}

    def peek():
        # Once the upstream has the call (it answers 0.5 s later), the claim must be
        # committed: wait for that moment rather than guess it with a fixed sleep.
        deadline = time.monotonic() + 5
        while not upstream.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        with tenant_scope(alice.key.tenant, readonly=True):
            seen["rows"] = list(Invocation.objects.values_list("status", flat=True))

    thread = threading.Thread(target=peek)
    thread.start()
    assert alice.invoke("slowpost", {}).status_code == 200
    thread.join()
    assert seen["rows"] == ["running"]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/x",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://2852039166/",
        "http://[::ffff:169.254.169.254]/",
        "http://169.254.10.10:8080/",
        "http://169.254.169.254./",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[2002:a9fe:a9fe::]/",
        "http://127.0.0.1:99999/",  # stored before apply refused it: no 500 at invoke
    ],
)
def test_it_refuses_link_local_and_metadata_endpoints_at_invoke(alice, url):
    with tenant_scope(alice.key.tenant, readonly=True):
        tool = Tool.objects.get(tenant=alice.key.tenant, name="secret.tool")
    manifest = tool.manifest
    manifest["spec"]["endpoint"] = {
        "type": "http",
        "url": url,
        "method": "POST",
        "timeout_ms": 1000,
    }
    manifest["spec"]["scopes_required"] = []
    with tenant_scope(alice.key.tenant):
        Tool.objects.filter(pk=tool.pk).update(manifest=manifest, digest="forced")
    response = alice.invoke("secret.tool", {})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "endpoint_forbidden"
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "denied"


def test_an_upstream_answer_with_nul_is_invalid_output(alice, upstream):
    add_tool(alice, "nul", upstream.url("/nul"))
    response = alice.invoke("nul", {})
    assert response.status_code == 502
    assert error_of(response)["code"] == "invalid_output"


def test_an_upstream_answer_with_nan_is_invalid_output_in_both_languages(alice, upstream):
    """Python's json reads NaN and Infinity; JSON has no such numbers, and no encoder
    after the parse would keep them (one writes null, PostgreSQL refuses the row)."""
    add_tool(alice, "nan", upstream.url("/nan"))
    response = alice.invoke("nan", {}, headers={"Accept-Language": "fr"})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "invalid_output"
    assert "NaN or Infinity" in error["message_i18n"]["en"]
    assert "que JSON n’admet pas" in error["message"]
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=error["invocation_id"])
    assert stored.status == "failed" and stored.output is None


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize(
    ("route", "reason"),
    [
        ("/surrogate", "lone surrogate"),
        ("/deep", "nested deeper than 100 levels"),
        ("/huge-float", "NaN or Infinity"),
    ],
)
def test_hostile_upstream_json_is_invalid_output_and_the_call_settles(
    alice, upstream, route, reason, idempotent
):
    """Valid JSON syntax that cannot be stored or sent on: the call fails cleanly (502),
    once, with its record settled, never a 500 or a false `audit_unavailable`."""
    add_tool(alice, "hostile", upstream.url(route), idempotent=idempotent)
    response = alice.invoke("hostile", {})
    assert response.status_code == 502, response.content
    error = error_of(response)
    assert error["code"] == "invalid_output"
    assert reason in error["message_i18n"]["en"] and reason not in error["message_i18n"]["fr"]
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=error["invocation_id"])
    assert stored.status == "failed" and stored.finished_at is not None
    assert len([c for c in upstream.calls if c["path"] == route]) == 1


def test_it_reads_chunked_and_gzip_answers(alice, upstream):
    add_tool(alice, "chunked", upstream.url("/chunked"))
    add_tool(alice, "zipped", upstream.url("/gzip"))
    assert alice.invoke("chunked", {}).json()["output"] == {"parts": ["a", "b"]}
    assert alice.invoke("zipped", {}).json()["output"] == {"zipped": True}
    assert upstream.calls[-1]["headers"]["Accept-Encoding"] == "identity"


def test_it_reuses_a_kept_alive_connection_and_survives_a_closed_one(alice, upstream):
    add_tool(alice, "echo", upstream.url("/echo"))
    add_tool(alice, "closing", upstream.url("/close"))
    for _ in range(3):
        assert alice.invoke("echo", {"n": 1}).status_code == 200
    assert len({call["client"] for call in upstream.calls}) == 1  # one connection, reused
    # The upstream closes after answering: the next call opens a new connection.
    for _ in range(2):
        assert alice.invoke("closing", {}).json()["output"] == {"closed": 1}
        assert alice.invoke("echo", {"n": 2}).json()["output"]["got"] == {"n": 2}
    clients = [call["client"] for call in upstream.calls]
    assert clients[3] == clients[0]  # the first "closing" call still came on the kept one
    assert clients[4] != clients[3] and clients[5] == clients[4]  # then a new one, kept


def test_a_socket_idle_too_long_is_not_reused(alice, upstream, monkeypatch):
    from gateway import endpoints

    monkeypatch.setattr(endpoints, "MAX_IDLE_S", 0.05)
    add_tool(alice, "echo", upstream.url("/echo"))
    assert alice.invoke("echo", {}).status_code == 200
    assert alice.invoke("echo", {}).status_code == 200  # at once: the same socket
    time.sleep(0.1)
    assert alice.invoke("echo", {}).status_code == 200  # past the limit: a new one
    clients = [call["client"] for call in upstream.calls]
    assert clients[0] == clients[1] and clients[2] != clients[1]


def test_a_slow_dripping_answer_times_out_within_the_tool_timeout(alice, upstream):
    # Each byte arrives well within the timeout; the whole answer does not.
    add_tool(alice, "drip", upstream.url("/drip"), endpoint={"timeout_ms": 500})
    started = time.monotonic()
    response = alice.invoke("drip", {})
    assert response.status_code == 504, response.content
    assert error_of(response)["code"] == "tool_timeout"
    assert time.monotonic() - started < 1.5


def test_the_allowed_hosts_list_is_checked_at_invoke_as_it_stands(alice, upstream, settings):
    add_tool(alice, "echo", upstream.url("/echo"))
    assert alice.invoke("echo", {}).status_code == 200
    settings.EAI_ALLOWED_TOOL_HOSTS = ["tools.example.com"]
    response = alice.invoke("echo", {})
    assert response.status_code == 403
    assert error_of(response)["code"] == "endpoint_forbidden"
    settings.EAI_ALLOWED_TOOL_HOSTS = ["127.0.0.1"]
    assert alice.invoke("echo", {}).status_code == 200


@pytest.mark.parametrize(
    "endpoint",
    [
        {"headers": {"X-Team": "a\r\nInjected: 1"}},
        {"headers": {"Bad Name": "x"}},
        {"url_suffix": "/echo x HTTP/1.1\r\nInjected: 1\r\n\r\nGET /echo"},
    ],
)
def test_header_and_request_line_injection_never_reaches_the_upstream(alice, upstream, endpoint):
    add_tool(alice, "echo", upstream.url("/echo"))
    with tenant_scope(alice.key.tenant, readonly=True):
        tool = Tool.objects.get(tenant=alice.key.tenant, name="echo")
    manifest = tool.manifest
    manifest["spec"]["endpoint"]["headers"] = endpoint.get("headers", {})
    manifest["spec"]["endpoint"]["url"] = upstream.url("") + endpoint.get("url_suffix", "/echo")
    # Written past the manifest checks, as a tampered row would be.
    with tenant_scope(alice.key.tenant):
        Tool.objects.filter(pk=tool.pk).update(manifest=manifest, digest="forced")
    response = alice.invoke("echo", {})
    assert response.status_code in (403, 503), response.content
    assert error_of(response)["code"] in ("tool_unavailable", "endpoint_forbidden")
    assert not any("Injected" in call["headers"] for call in upstream.calls)
    assert upstream.calls == []


def test_it_reads_an_answer_delimited_by_close_and_one_after_early_hints(alice, upstream):
    add_tool(alice, "eof", upstream.url("/eof"))
    add_tool(alice, "hints", upstream.url("/hints"))
    assert alice.invoke("eof", {}).json()["output"] == {"until": "eof"}
    assert alice.invoke("hints", {}).json()["output"] == {"after": "hints"}
    assert alice.invoke("eof", {}).json()["output"] == {"until": "eof"}


def test_an_https_upstream_with_an_untrusted_certificate_is_unavailable(alice, tmp_path):
    import datetime
    import socket
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:  # one TLS handshake attempt; the client refuses the certificate
        conn, _addr = listener.accept()
        try:
            context.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    add_tool(alice, "tls", f"https://127.0.0.1:{port}/")
    response = alice.invoke("tls", {})
    thread.join(5)
    listener.close()
    assert response.status_code == 503, response.content
    assert error_of(response)["code"] == "tool_unavailable"


def test_a_second_answer_in_the_same_write_is_ignored_and_the_socket_dropped(alice, upstream):
    add_tool(alice, "double", upstream.url("/double"))
    add_tool(alice, "echo", upstream.url("/echo"))
    assert alice.invoke("double", {}).json()["output"] == {"n": 1}
    # The next call must not read the stray second answer as its own.
    assert alice.invoke("echo", {"k": 2}).json()["output"]["got"] == {"k": 2}


def test_an_upstream_switching_protocols_is_unavailable(alice, upstream):
    add_tool(alice, "upgrade", upstream.url("/upgrade"))
    response = alice.invoke("upgrade", {})
    assert response.status_code == 503, response.content
    assert error_of(response)["code"] == "tool_unavailable"


def test_a_non_idempotent_call_is_settled_once_with_its_usage_audit_and_events(alice, upstream):
    from gateway import audit
    from gateway.models import AuditEvent, Event, UsageEvent

    add_tool(alice, "post", upstream.url("/echo"), cost={"amount": "0.25", "currency": "EUR"})
    body = alice.invoke("post", {"n": 1}).json()
    with scope(alice.key.tenant):
        invocation = Invocation.objects.get(pk=body["invocation_id"])
        assert invocation.status == "succeeded"
        assert invocation.output == {"method": "POST", "got": {"n": 1}}
        assert invocation.sealed_input is None and invocation.error is None
        assert str(invocation.cost_amount) == "0.250000" and invocation.finished_at is not None
        # Stored in the form the ORM queries with (SQLite compares datetimes as text).
        settled = Invocation.objects.filter(
            pk=invocation.pk, status="succeeded", cost_currency="EUR"
        )
        assert settled.filter(finished_at__lte=invocation.finished_at).exists()
        assert settled.filter(output__got__n=1, cost_amount=invocation.cost_amount).exists()
        assert UsageEvent.objects.filter(invocation_id=invocation.pk).count() == 1
        assert list(
            Event.objects.filter(invocation_id=invocation.pk)
            .order_by("sequence")
            .values_list("type", flat=True)
        ) == ["agent.tool.requested", "agent.tool.started", "agent.tool.completed"]
        assert (
            AuditEvent.objects.filter(object_ref=invocation.pk, action="tool.invoke").count() == 1
        )
        # Settling it again (a recovery sweep racing the worker) moves nothing, writes nothing.
        links, events = AuditEvent.objects.count(), Event.objects.count()
        invocation.status = "failed"
        assert not audit.settle_with_rows(
            alice.key.tenant, invocation, [], [audit.Entry("tool.invoke", "x", invocation.pk)], []
        )
        assert (AuditEvent.objects.count(), Event.objects.count()) == (links, events)
        assert Invocation.objects.get(pk=invocation.pk).status == "succeeded"
    # Nor does another tenant's settle of a call that is still running.
    from tenants.models import Tenant

    with scope(alice.key.tenant):
        Invocation.objects.filter(pk=invocation.pk).update(status="running")
    other = Tenant.objects.create(slug="other-settler", name="Other")
    assert not audit.settle_with_rows(other, invocation, [], [], [])
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.get(pk=invocation.pk).status == "running"
    assert audit.settle_with_rows(alice.key.tenant, invocation, [], [], [])
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.get(pk=invocation.pk).status == "failed"
    with scope(alice.key.tenant):
        assert audit.verify_chain(alice.key.tenant)["valid"] is True


def test_an_answer_with_endless_headers_is_refused_not_buffered(alice, upstream):
    add_tool(alice, "pad", upstream.url("/endless-headers"))
    response = alice.invoke("pad", {})
    assert response.status_code == 502, response.content
    assert error_of(response)["code"] == "invalid_output"


def test_a_kept_socket_numbered_over_1023_is_still_seen_alive(high_socket_pair):
    """select() cannot watch descriptors from 1024 up; the idle check must not take
    such a socket for dropped (a busy server would then open a connection a call)."""
    from gateway.endpoints import _dropped

    high, there = high_socket_pair
    assert _dropped(high) is False  # idle and open
    there.close()
    assert _dropped(high) is True  # the peer closed it
