"""The error envelope for every kind of bad request, in English and French."""

import json

import pytest
from django.test import override_settings

from gateway.models import Decision, Invocation
from tenants.scope import tenant_scope

from .conftest import error_of, scope


def test_it_answers_french_with_accept_language_fr(alice):
    """Seed test 5: an error comes back in French with Accept-Language: fr."""
    response = alice.invoke("no.such.tool", {}, headers={"Accept-Language": "fr-FR,fr;q=0.9"})
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "tool_not_found"
    assert error["message"] == error["message_i18n"]["fr"]
    assert (
        error["message"]
        == "L’outil « no.such.tool » n’existe pas dans le catalogue de ce locataire."
    )
    assert (
        error["message_i18n"]["en"]
        == "Tool 'no.such.tool' does not exist in this tenant's catalog."
    )


def test_it_answers_english_by_default_and_for_other_languages(alice):
    for header in (
        {},
        {"Accept-Language": "de-DE"},
        {"Accept-Language": "en-GB,fr;q=0.5"},
        {"Accept-Language": "fr;q=0"},
        {"Accept-Language": "fr;q=0.0, de"},
    ):
        error = error_of(alice.invoke("no.such.tool", {}, headers=header))
        assert error["message"] == error["message_i18n"]["en"]


def test_it_translates_drf_and_django_errors(alice):
    for path in ("/v1/nowhere", "/v1", "/v1/"):
        error = error_of(alice.get(path, headers={"Accept-Language": "fr"}))
        assert error["code"] == "not_found"
        assert error["message"] == "Introuvable."
    response = alice.client.delete(
        "/v1/tools", headers={"Authorization": f"Bearer {alice.raw_key}", "Accept-Language": "fr"}
    )
    assert response.status_code == 405
    error = error_of(response)
    assert error["code"] == "method_not_allowed"
    assert "DELETE" in error["message"] and error["message"] != error["message_i18n"]["en"]


@pytest.mark.parametrize(
    "raw",
    ['{"input": ', "{'input': {}}", '{"input": NaN}', "[1, 2", "\ufeff{", "nul", '{"a":1}}'],
)
def test_it_answers_invalid_json(alice, raw):
    response = alice.post("/v1/tools/jira.search/invoke", raw=raw)
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "invalid_json"
    assert error["message_i18n"]["fr"].startswith("Le corps de la requête n’est pas du JSON valide")
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"input": {"a": 1e400}}', "the number 1e400 is too large"),
        ('{"input": {"a": -1e999}}', "is too large"),
        ('{"input": {"a": "x\\ud800"}}', "lone surrogate"),
        ('{"input": {"\\udc00": 1}}', "lone surrogate"),
        ('{"input": {"a": ' + "9" * 5000 + "}}", "too many digits"),
    ],
)
def test_json_that_parses_but_cannot_be_kept_is_invalid_json(alice, raw, reason):
    # the fast path and DRF's (an Accept it does not take) answer alike
    for accept in ("application/json", "application/json;q=0.9, text/html;q=0.1"):
        response = alice.post("/v1/tools/jira.search/invoke", raw=raw, headers={"Accept": accept})
        assert response.status_code == 400, response.content
        error = error_of(response)
        assert error["code"] == "invalid_json" and reason in error["message_i18n"]["en"]
        assert reason not in error["message_i18n"]["fr"]  # translated, not quoted
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()
    # a surrogate pair is an ordinary character
    ok = alice.post("/v1/tools/jira.search/invoke", raw='{"input": {"q": "\\ud83d\\ude00"}}')
    assert ok.status_code == 200, ok.content


def test_it_answers_invalid_json_for_an_empty_body(alice):
    response = alice.post("/v1/tools/jira.search/invoke", raw="")
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def test_it_refuses_json_nested_deeper_than_100(alice):
    deep = {"q": "x"}
    node = deep
    for _ in range(100):
        node["n"] = {}
        node = node["n"]
    response = alice.post("/v1/tools/jira.search/invoke", {"input": deep})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"
    hostile = "[" * 100_000 + "]" * 100_000
    response = alice.post("/v1/tools/jira.search/invoke", raw=hostile)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def test_it_accepts_json_nested_100_deep(alice):
    node = inner = {}
    for _ in range(97):  # body > input > 97 levels + leaf dict = 100 levels
        inner["n"] = {}
        inner = inner["n"]
    response = alice.post("/v1/tools/secret.tool/invoke", {"input": node})
    # secret.tool needs a scope alice lacks: the body was parsed and reached the policy
    assert error_of(response)["code"] == "policy_denied"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/xml",
        "multipart/form-data; boundary=x",
    ],
)
def test_it_answers_415_for_bodies_that_are_not_json(alice, content_type):
    response = alice.post(
        "/v1/tools/jira.search/invoke", raw='{"input": {"q": "x"}}', content_type=content_type
    )
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()


def test_it_answers_415_for_a_compressed_body(alice):
    import gzip

    for path in ("/v1/tools/jira.search/invoke", "/v1/manifests/apply"):
        response = alice.post(
            path,
            raw=gzip.compress(b'{"input": {"q": "x"}}'),
            headers={"Content-Encoding": "gzip", "Accept-Language": "fr"},
        )
        assert response.status_code == 415
        error = error_of(response)
        assert error["code"] == "unsupported_media_type"
        assert "Content-Encoding: gzip" in error["message_i18n"]["en"]
        assert "Content-Encoding: gzip" in error["message"] != error["message_i18n"]["en"]
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()
    plain = alice.post(
        "/v1/tools/jira.search/invoke",
        raw='{"input": {"q": "x"}}',
        headers={"Content-Encoding": "identity"},
    )
    assert plain.status_code == 200


@override_settings(EAI_MAX_REQUEST_BYTES=1000)
def test_it_answers_413_for_oversized_bodies(alice):
    body = json.dumps({"input": {"q": "x" * 2000}})
    response = alice.post("/v1/tools/jira.search/invoke", raw=body)
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "payload_too_large"
    assert "1000" in error["message"]
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()
        assert not Decision.objects.exists()


def test_it_answers_413_at_the_default_limit_of_one_mebibyte(alice):
    body = json.dumps({"input": {"q": "x" * (1024 * 1024)}})
    response = alice.post("/v1/tools/jira.search/invoke", raw=body)
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"


class _AnyParams(dict):
    def __missing__(self, key):
        return "x"


def test_every_error_message_has_a_real_french_translation():
    from eai.errors import MESSAGES, render_message

    for code in MESSAGES:
        english = render_message(code, _AnyParams(), "en")
        french = render_message(code, _AnyParams(), "fr")
        assert french != english, code


def test_it_refuses_nul_characters_clearly(alice):
    response = alice.post("/v1/tools/jira.search/invoke", raw='{"input": {"q": "a\\u0000b"}}')
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_json" and "u0000" in error["message"]
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()
    # An escaped backslash followed by the text u0000 is ordinary text.
    ok = alice.post("/v1/tools/jira.search/invoke", raw='{"input": {"q": "a\\\\u0000b"}}')
    assert ok.status_code == 200


# The invoke route answers well-formed calls without DRF's request machinery and hands
# everything else to DRF: both must answer alike, and every refusal must still come.


def _invoke_raw(alice, body, **headers):
    return alice.client.post(
        "/v1/tools/jira.search/invoke",
        body,
        content_type=headers.pop("content_type", "application/json"),
        **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()},
    )


def test_the_fast_and_the_drf_invoke_paths_answer_alike(alice):
    from django.test import RequestFactory

    from gateway.views import InvokeView, TenantAPIView

    fast = _invoke_raw(alice, '{"input": {"q": "x"}}', authorization=f"Bearer {alice.raw_key}")
    request = RequestFactory().post(
        "/v1/tools/jira.search/invoke",
        '{"input": {"q": "x"}}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {alice.raw_key}",
    )
    request.request_id = "req_drf"
    view = InvokeView()
    view.setup(request, name="jira.search")
    through_drf = TenantAPIView.dispatch(view, request, name="jira.search")  # DRF's own path
    assert fast.status_code == through_drf.status_code == 200
    assert fast["Allow"] == through_drf["Allow"] == "POST"
    assert fast["Content-Type"] == through_drf["Content-Type"] == "application/json"
    fast_body, drf_body = fast.json(), json.loads(through_drf.content)
    for varying in ("invocation_id", "decision_id", "created_at", "finished_at"):
        fast_body.pop(varying), drf_body.pop(varying)
    assert fast_body == drf_body
    with scope(alice.key.tenant):
        assert Invocation.objects.count() == 2


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        ('{"input": {}}', {"authorization": "Bearer eai_nope_nope"}, 401, "unauthenticated"),
        ('{"input": {}}', {"authorization": "Basic abc"}, 401, "unauthenticated"),
        ('{"input": {}}', {}, 401, "unauthenticated"),
        ('{"input": ', {"key": True}, 400, "invalid_json"),
        ("", {"key": True}, 400, "invalid_json"),
        ('{"input": "\\u0000"}', {"key": True}, 400, "invalid_json"),
        ('{"input": {}}', {"key": True, "accept": "text/html"}, 406, "not_acceptable"),
        ("input: {}", {"key": True, "content_type": "text/plain"}, 415, "unsupported_media_type"),
    ],
)
def test_malformed_invokes_are_still_refused_by_drf(alice, body, headers, status, code):
    headers = dict(headers)
    if headers.pop("key", False):
        headers["authorization"] = f"Bearer {alice.raw_key}"
    response = _invoke_raw(alice, body, **headers)
    assert response.status_code == status, response.content
    assert error_of(response)["code"] == code
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()


def test_api_calls_skip_sessions_and_messages_but_the_portal_keeps_them(alice, client):
    from django.contrib.auth.models import User

    for response in (
        alice.invoke("jira.search", {"q": "x"}),
        alice.get("/v1/tools"),
        client.get("/v1/docs"),
    ):
        assert response.status_code == 200
        # No session or flash-message cookie on the API (Swagger's page asks for CSRF's).
        assert not {"sessionid", "messages"} & set(response.cookies)
    User.objects.create_superuser("root", "root@example.com", "pw-pw-pw-pw-1")
    response = client.post(
        "/admin/login/?next=/admin/", {"username": "root", "password": "pw-pw-pw-pw-1"}
    )
    assert response.status_code == 302
    assert "sessionid" in response.cookies
    assert client.get("/admin/").status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_probe_routes_answer_other_methods_with_the_envelope(path, method):
    from django.test import Client

    # CSRF enforced, as a real server does (the test client skips it by default).
    client = Client(enforce_csrf_checks=True, HTTP_ACCEPT_LANGUAGE="fr")
    response = getattr(client, method)(path)
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"
    error = error_of(response)
    assert error["code"] == "method_not_allowed" and error["message"] == error["message_i18n"]["fr"]
    assert client.get(path).status_code != 405


@pytest.mark.parametrize("path", ["/v1/docs", "/v1/openapi.json"])
def test_the_docs_routes_refuse_other_methods_with_the_json_envelope(client, path):
    response = client.put(path)
    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert error_of(response)["code"] == "method_not_allowed"


@pytest.mark.parametrize("path", ["/healthz/", "//v1/tools", "/V1/tools", "/", "/nowhere"])
def test_mistyped_paths_get_the_envelope(client, path):
    response = client.get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert error_of(response)["code"] == "not_found"


def test_the_portal_keeps_its_pages(client):
    assert client.get("/admin/nowhere/").status_code == 302  # to the login page
    response = client.get("/static/nowhere.css")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")


def _all_text(response) -> str:
    return response.content.decode()


def test_a_too_large_number_is_quoted_masked(alice):
    response = alice.post(
        "/v1/tools/jira.search/invoke", raw='{"input": {"q": 4111111111111111e400}}'
    )
    assert error_of(response)["code"] == "invalid_json"
    assert "4111111111111111" not in _all_text(response)
    assert "4111********1111e400" in error_of(response)["message"]


def test_an_unknown_tools_name_is_quoted_masked(alice):
    for path in ("/v1/tools/FR7630006000011234567890189", "/v1/tools/jean.dupont@example.fr"):
        response = alice.get(path)
        assert error_of(response)["code"] == "tool_not_found"
        assert "FR7630006000011234567890189" not in _all_text(response)
        assert "jean.dupont@example.fr" not in _all_text(response)
    response = alice.invoke("FR7630006000011234567890189", {})
    assert error_of(response)["code"] == "tool_not_found"
    assert "FR76*******************0189" in error_of(response)["message_i18n"]["fr"]


def test_invalid_input_masks_values_before_cutting_and_names_in_paths(alice):
    from gateway.manifests import apply_manifests

    from .conftest import echo_manifest

    manifest = echo_manifest(
        "util.short",
        {
            "type": "object",
            "properties": {"s": {"type": "string", "maxLength": 3}},
            "additionalProperties": {"type": "integer"},
        },
    )
    apply_manifests(tenant=alice.key.tenant, documents=[manifest])
    # The IBAN straddles the 500th character of jsonschema's message.
    long_value = "a" * 482 + " FR7630006000011234567890189"
    response = alice.invoke(
        "util.short",
        {"s": long_value, "x/FR7630006000011234567890189": "no", "y~4111111111111111": "no"},
    )
    assert error_of(response)["code"] == "invalid_input"
    text = _all_text(response)
    for raw in ("FR7630006000011234567890189", "FR76300060000112", "4111111111111111"):
        assert raw not in text
    paths = sorted(e["path"] for e in error_of(response)["details"]["errors"])
    assert paths == ["/s", "/x~1FR76*******************0189", "/y~04111********1111"]
    assert all(len(e["message"]) <= 500 for e in error_of(response)["details"]["errors"])


def test_routes_that_read_no_body_still_refuse_a_bad_one(alice):
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    ).json()
    cancel = f"/v1/tools/invocations/{parked['invocation_id']}/cancel"
    response = alice.post(cancel, raw="{bad")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    response = alice.post(cancel, raw="x", content_type="text/plain")
    assert response.status_code == 415
    with tenant_scope(alice.key.tenant):
        assert Invocation.objects.get(pk=parked["invocation_id"]).status == "waiting_approval"
    alice.post("/v1/runs", {"run_id": "run_body"})
    response = alice.post("/v1/runs/run_body/resume", raw="{bad")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    # No body, or a JSON one, as before.
    assert alice.post("/v1/runs/run_body/resume").status_code == 200
    assert alice.post(cancel, {}).status_code == 200


def test_manifests_come_as_text_x_yaml_too(alice):
    import yaml

    from .conftest import tool_manifest

    body = yaml.safe_dump(tool_manifest("util.yaml", {"type": "builtin", "callable": "echo"}))
    response = alice.post("/v1/manifests/apply", raw=body, content_type="text/x-yaml")
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    "raw",
    [
        b'{"input": {"q": "a\xed\xa0\x80"}}',  # a surrogate, UTF-8-encoded
        '{"input": {"q": "a"}}'.encode("utf-16"),
        '{"input": {"q": "a"}}'.encode("utf-32"),
        b"\xef\xbb\xbf" + b'{"input": {"q": "a"}}',  # a BOM
    ],
)
def test_a_body_that_is_not_strict_utf_8_is_invalid_json(alice, raw):
    response = alice.post("/v1/tools/jira.search/invoke", raw=raw)
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == "invalid_json"


def test_a_surrogate_in_a_runs_goal_cannot_break_the_event_feed(alice):
    """Stored once, a lone surrogate made every page of the tenant's feed that held it
    answer 500, for good."""
    response = alice.post("/v1/runs", raw=b'{"run_id": "run_sur", "goal": "g\xed\xa0\x80"}')
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    assert alice.get("/v1/events").status_code == 200


def test_options_is_refused_like_any_method_a_route_does_not_take(alice):
    """DRF answered OPTIONS with its metadata, which the OpenAPI document does not
    describe (SPEC §12): now 405 in the envelope, and no route's Allow names it."""
    for path in ("/v1/tools", "/v1/tools/jira.search/invoke", "/v1/audit/verify"):
        response = alice.client.options(path, HTTP_AUTHORIZATION=f"Bearer {alice.raw_key}")
        assert response.status_code == 405, (path, response.content[:200])
        assert response.json()["error"]["code"] == "method_not_allowed"
        assert "OPTIONS" not in response["Allow"]
