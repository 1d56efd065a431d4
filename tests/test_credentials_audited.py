"""Setting or deleting a credential (admin, command) writes a chained audit entry in the
same transaction, naming the credential and never holding its secret."""

import io
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError

from gateway import audit
from gateway.models import AuditEvent, StoredCredential
from tenants.models import Membership
from tenants.scope import tenant_scope

from .test_admin_portal import browser, staff

SECRET = "cr3d-Audited-Secret-0123456789abcdef"


def entries(tenant, prefix="credential."):
    with tenant_scope(tenant, readonly=True):
        return [
            audit.event_view(e)
            for e in AuditEvent.objects.for_tenant(tenant).order_by("seq")
            if e.action.startswith(prefix)
        ]


def stored(tenant):
    with tenant_scope(tenant, readonly=True):
        return set(StoredCredential.objects.for_tenant(tenant).values_list("name", flat=True))


def everything_audited(tenant) -> str:
    with tenant_scope(tenant, readonly=True):
        return "\n".join(AuditEvent.objects.for_tenant(tenant).values_list("canonical", flat=True))


def set_by_command(tenant, name, secret=SECRET):
    with mock.patch("sys.stdin", io.StringIO(secret + "\n")):
        call_command("set_credential", name, "--tenant", tenant.slug, stdout=io.StringIO())


def test_it_audits_the_command_setting_replacing_and_deleting_a_credential(tenant_a, tenant_b):
    set_by_command(tenant_a, "crm-bot")
    set_by_command(tenant_a, "crm-bot", SECRET + "-v2")
    call_command("set_credential", "crm-bot", "--tenant", "acme", "--delete", stdout=io.StringIO())
    got = [(e["action"], e["actor"], e["object_ref"], e["payload"]) for e in entries(tenant_a)]
    assert got == [
        (
            "credential.set",
            "command:set_credential",
            "credential:crm-bot",
            {"credential": "crm-bot", "via": "command", "replaced": False},
        ),
        (
            "credential.set",
            "command:set_credential",
            "credential:crm-bot",
            {"credential": "crm-bot", "via": "command", "replaced": True},
        ),
        (
            "credential.deleted",
            "command:set_credential",
            "credential:crm-bot",
            {"credential": "crm-bot", "via": "command"},
        ),
    ]
    assert stored(tenant_a) == set()
    assert SECRET not in everything_audited(tenant_a)
    with tenant_scope(tenant_a, readonly=True):
        assert audit.verify_chain(tenant_a)["valid"] is True
    assert entries(tenant_b) == []  # the other tenant's chain holds none of it


def test_deleting_a_credential_that_does_not_exist_fails_and_records_nothing(tenant_a):
    with pytest.raises(CommandError, match="No credential"):
        call_command("set_credential", "nope", "--tenant", "acme", "--delete")
    assert entries(tenant_a) == []


def test_a_failed_audit_write_leaves_the_credential_unchanged(tenant_a):
    set_by_command(tenant_a, "crm-bot")
    with (
        mock.patch.object(audit, "record", side_effect=DatabaseError("disk full")),
        pytest.raises(DatabaseError),
    ):
        set_by_command(tenant_a, "other-bot")
    assert stored(tenant_a) == {"crm-bot"}
    with (
        mock.patch.object(audit, "record", side_effect=DatabaseError("disk full")),
        pytest.raises(DatabaseError),
    ):
        call_command("set_credential", "crm-bot", "--tenant", "acme", "--delete")
    assert stored(tenant_a) == {"crm-bot"}
    assert len(entries(tenant_a)) == 1


def test_the_admin_audits_setting_and_deleting_once_each(tenant_a, tenant_b):
    tina = staff("tina", tenant_a, role=Membership.ROLE_ADMIN)
    client = browser(tina)
    response = client.post(
        "/admin/gateway/storedcredential/add/", {"name": "crm-bot", "secret": SECRET}
    )
    assert response.status_code == 302, response.content[:2000]
    with tenant_scope(tenant_a, readonly=True):
        pk = StoredCredential.objects.for_tenant(tenant_a).get(name="crm-bot").pk
    response = client.post(
        f"/admin/gateway/storedcredential/{pk}/change/", {"secret": SECRET + "-v2"}
    )
    assert response.status_code == 302, response.content[:2000]
    response = client.post(f"/admin/gateway/storedcredential/{pk}/delete/", {"post": "yes"})
    assert response.status_code == 302, response.content[:2000]
    set_by_command(tenant_a, "one")
    set_by_command(tenant_a, "two")
    with tenant_scope(tenant_a, readonly=True):
        pks = list(StoredCredential.objects.for_tenant(tenant_a).values_list("pk", flat=True))
    response = client.post(
        "/admin/gateway/storedcredential/",
        {"action": "delete_selected", "_selected_action": pks, "post": "yes"},
    )
    assert response.status_code == 302, response.content[:2000]
    got = [(e["action"], e["actor"], e["payload"]) for e in entries(tenant_a)]
    by_tina = f"user:{tina.pk}"
    assert got[:3] == [
        ("credential.set", by_tina, {"credential": "crm-bot", "via": "admin", "replaced": False}),
        ("credential.set", by_tina, {"credential": "crm-bot", "via": "admin", "replaced": True}),
        ("credential.deleted", by_tina, {"credential": "crm-bot", "via": "admin"}),
    ]
    assert sorted((a, p["credential"]) for a, actor, p in got[5:] if actor == by_tina) == [
        ("credential.deleted", "one"),
        ("credential.deleted", "two"),
    ]
    assert stored(tenant_a) == set()
    assert SECRET not in everything_audited(tenant_a)
    assert entries(tenant_b) == []
