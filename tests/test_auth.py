"""API-key authentication: every bad key kind is the same 401 `unauthenticated`."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gateway.keys import revoke_api_key
from tenants.models import ApiKey, key_digest

from .conftest import Api, error_of


def assert_unauthenticated(response):
    assert response.status_code == 401, response.content
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert error_of(response)["code"] == "unauthenticated"


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token eai_abc_def",
        "Bearer eai_abc",
        "Bearer eai__def",
        "Bearer eai_abc_",
        "Bearer eai_ab-c_def",
        "Bearer xyz_abc_def",
        "Bearer eai_abc_def_ghi",
        "Bearer eai_nope_nope",
        "Bearer " + "eai_" + "a" * 5000 + "_b",
    ],
)
def test_it_rejects_malformed_or_unknown_keys(db, header):
    api = Api(None)
    headers = {"Authorization": header} if header is not None else {}
    assert_unauthenticated(api.get("/v1/tools", headers=headers))


def test_it_rejects_a_wrong_secret(alice):
    key_id = alice.key.key_id
    assert_unauthenticated(Api(f"eai_{key_id}_wrongsecret").get("/v1/tools"))


def test_it_rejects_an_expired_key(make_api, tenant_a):
    api = make_api(tenant_a, expires_at=timezone.now() - timedelta(seconds=1))
    assert_unauthenticated(api.get("/v1/tools"))


def test_it_rejects_a_revoked_key(alice):
    assert alice.get("/v1/tools").status_code == 200
    assert revoke_api_key(key=alice.key) is True
    assert revoke_api_key(key=alice.key) is False  # revoking twice changes nothing
    assert_unauthenticated(alice.get("/v1/tools"))


def test_it_rejects_a_key_of_an_inactive_tenant(alice, tenant_a):
    tenant_a.is_active = False
    tenant_a.save()
    assert_unauthenticated(alice.get("/v1/tools"))


def test_it_stores_only_the_digest(alice):
    key = ApiKey.objects.get(pk=alice.key.pk)
    secret = alice.raw_key.rsplit("_", 1)[1]
    assert key.digest == key_digest(secret)
    assert secret not in key.digest
    assert alice.raw_key.startswith(f"eai_{key.key_id}_")


def test_it_answers_401_on_invoke_without_a_key(tenant_a):
    response = Api(None).invoke("jira.search", {"q": "x"})
    assert_unauthenticated(response)


def test_it_answers_403_insufficient_scope_on_routes_other_than_invoke(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:invoke"])
    response = api.get("/v1/tools")
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "insufficient_scope"
    assert "tools:read" in error["message"]
    assert "tools:read" in error["message_i18n"]["fr"]
