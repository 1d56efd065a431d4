"""Credentials in the admin: tenant admins set them, nobody reads them back."""

from django.db import connection

from gateway.manifests import apply_manifests
from gateway.models import AuditEvent, StoredCredential
from tenants.models import Membership
from tenants.scope import tenant_scope

from .conftest import scope, tool_manifest
from .test_admin_portal import browser, staff

SECRET = "adm1n-set-Secret-value-0123456789"


def test_a_tenant_admin_sets_a_write_only_credential(alice, tenant_a, upstream):
    tina = staff("tina", tenant_a, role=Membership.ROLE_ADMIN)
    client = browser(tina)
    response = client.post(
        "/admin/gateway/storedcredential/add/", {"name": "crm-bot", "secret": SECRET}
    )
    assert response.status_code == 302, response.content[:2000]
    with tenant_scope(tenant_a, readonly=True):
        credential = StoredCredential.objects.get(tenant=tenant_a, name="crm-bot")
    with tenant_scope(tenant_a, readonly=True), connection.cursor() as cursor:
        cursor.execute(
            "SELECT ciphertext FROM gateway_storedcredential WHERE id = %s", [credential.pk]
        )
        assert SECRET.encode() not in bytes(cursor.fetchone()[0])
    page = client.get(f"/admin/gateway/storedcredential/{credential.pk}/change/").content.decode()
    assert SECRET not in page
    with tenant_scope(tenant_a, readonly=True):
        assert AuditEvent.objects.filter(action="credential.set").count() == 1
    apply_manifests(
        tenant=tenant_a,
        documents=[
            tool_manifest(
                "crm.sync", {"type": "http", "url": upstream.url("/echo")}, credential_ref="crm-bot"
            )
        ],
    )
    assert alice.invoke("crm.sync", {}).status_code == 200
    assert upstream.calls[-1]["headers"]["Authorization"] == f"Bearer {SECRET}"


def test_a_reviewer_cannot_reach_the_credential_store(tenant_a):
    rita = staff("rita", tenant_a)
    client = browser(rita)
    assert client.get("/admin/gateway/storedcredential/").status_code == 403
    response = client.post("/admin/gateway/storedcredential/add/", {"name": "x", "secret": "y"})
    assert response.status_code == 403
    with scope(tenant_a):
        assert not StoredCredential.objects.exists()
