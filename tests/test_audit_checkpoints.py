"""Signed checkpoints: only a trusted key's signature over a head the chain still holds
proves it (the current signing key, or a retired one listed in EAI_AUDIT_RETIRED_KEYS)."""

import base64
import json
import os

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection

from gateway import audit
from gateway.models import AuditCheckpoint, AuditEvent
from tenants.scope import tenant_scope

from .conftest import tamper
from .test_admin_portal import browser, staff


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def public_of(private_b64: str) -> str:
    private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(private_b64))
    return audit._raw_b64(private.public_key())


def grow(api, calls=1):
    for _ in range(calls):
        assert api.invoke("jira.search", {"q": "x"}).status_code == 200


def checkpoint(tenant):
    with tenant_scope(tenant):
        return audit.write_checkpoint(tenant)


def verify(tenant):
    with tenant_scope(tenant, readonly=True):
        return audit.verify_chain(tenant)


def forget_anchors(settings, tmp_path):
    """Verify against the database alone: the rows decide, not the anchor log."""
    settings.EAI_AUDIT_ANCHOR_PATH = str(tmp_path / "elsewhere.jsonl")


def test_an_intact_chain_with_a_checkpoint_is_valid_and_proven(alice, bob):
    grow(alice)
    signed = checkpoint(alice.key.tenant)
    result = verify(alice.key.tenant)
    assert result["valid"] is True
    assert result["first_invalid_seq"] is None
    assert result["proven_through_seq"] == signed.seq == result["length"]
    grow(alice)
    result = verify(alice.key.tenant)
    assert result["valid"] is True
    assert result["proven_through_seq"] == signed.seq < result["length"]
    assert verify(bob.key.tenant)["proven_through_seq"] == 0


def test_a_second_checkpoint_extends_the_proof(alice, bob):
    grow(alice)
    first = checkpoint(alice.key.tenant)
    grow(alice, 2)
    second = checkpoint(alice.key.tenant)
    assert second.seq > first.seq
    result = verify(alice.key.tenant)
    assert result["valid"] is True
    assert result["proven_through_seq"] == second.seq
    assert verify(bob.key.tenant)["valid"] is True


@pytest.mark.parametrize("which", ["first", "second"])
def test_a_forged_signature_on_either_checkpoint_is_invalid(alice, settings, tmp_path, which):
    grow(alice)
    first = checkpoint(alice.key.tenant)
    grow(alice, 2)
    second = checkpoint(alice.key.tenant)
    forget_anchors(settings, tmp_path)
    target = first if which == "first" else second
    other = second if which == "first" else first
    # A real signature, by the trusted key, over another head: it must not transfer.
    with tenant_scope(alice.key.tenant):
        AuditCheckpoint.objects.filter(pk=target.pk).delete()
        AuditCheckpoint.objects.create(
            tenant=alice.key.tenant,
            seq=target.seq,
            head_hash=target.head_hash,
            signature=other.signature,
            key_id=target.key_id,
        )
    result = verify(alice.key.tenant)
    assert result["valid"] is False
    assert result["first_invalid_seq"] == target.seq
    assert result["proven_through_seq"] == (0 if which == "first" else first.seq)


@pytest.mark.parametrize(
    "signature",
    ["", "not base64!", base64.b64encode(b"short").decode(), "A" * 88, "!genuine!"],
)
def test_a_junk_signature_by_the_trusted_key_id_is_invalid(alice, settings, tmp_path, signature):
    grow(alice)
    signed = checkpoint(alice.key.tenant)
    forget_anchors(settings, tmp_path)
    if signature == "!genuine!":  # the real signature with characters base64 lacks
        signature = "!" + signed.signature[:20] + "*" + signed.signature[20:]
    with tenant_scope(alice.key.tenant):
        AuditCheckpoint.objects.filter(pk=signed.pk).delete()
        AuditCheckpoint.objects.create(
            tenant=alice.key.tenant,
            seq=signed.seq,
            head_hash=signed.head_hash,
            signature=signature,
            key_id=signed.key_id,
        )
    result = verify(alice.key.tenant)
    assert (result["valid"], result["first_invalid_seq"]) == (False, signed.seq)


def test_a_checkpoint_of_another_tenant_proves_nothing_here(alice, bob, settings, tmp_path):
    """The signed message names the tenant: bob's signature over the same seq and hash
    would not verify as alice's."""
    grow(alice)
    signed = checkpoint(alice.key.tenant)
    message = audit._checkpoint_message(bob.key.tenant.public_id, signed.seq, signed.head_hash)
    forget_anchors(settings, tmp_path)
    with tenant_scope(alice.key.tenant):
        AuditCheckpoint.objects.filter(pk=signed.pk).delete()
        AuditCheckpoint.objects.create(
            tenant=alice.key.tenant,
            seq=signed.seq,
            head_hash=signed.head_hash,
            signature=base64.b64encode(audit.signing_key().sign(message)).decode(),
            key_id=signed.key_id,
        )
    assert verify(alice.key.tenant)["valid"] is False


def test_a_rotated_key_stays_trusted_only_while_listed_as_retired(alice, bob, settings):
    old, new = new_key(), new_key()
    settings.EAI_AUDIT_SIGNING_KEY = old
    grow(alice)
    first = checkpoint(alice.key.tenant)
    old_id = audit.key_id()
    assert first.key_id == old_id
    settings.EAI_AUDIT_SIGNING_KEY = new
    settings.EAI_AUDIT_RETIRED_KEYS = [public_of(old)]
    assert audit.key_id() != old_id
    grow(alice)
    second = checkpoint(alice.key.tenant)
    assert second.key_id == audit.key_id()
    result = verify(alice.key.tenant)
    assert result["valid"] is True and result["proven_through_seq"] == second.seq
    with tenant_scope(alice.key.tenant, readonly=True):
        exported = audit.export_checkpoints(alice.key.tenant)
    assert [line["public_key"] for line in exported] == [public_of(old), public_of(new)]
    # Dropped from the list: its checkpoints are forgeries like any unknown key's.
    settings.EAI_AUDIT_RETIRED_KEYS = []
    result = verify(alice.key.tenant)
    assert (result["valid"], result["first_invalid_seq"]) == (False, first.seq)
    with tenant_scope(alice.key.tenant, readonly=True):
        exported = audit.export_checkpoints(alice.key.tenant)
    assert [line["public_key"] for line in exported] == [None, public_of(new)]
    assert verify(bob.key.tenant)["valid"] is True


def test_a_retired_key_that_is_not_a_public_key_is_a_configuration_error(alice, settings):
    settings.EAI_AUDIT_RETIRED_KEYS = ["not-a-key"]
    with pytest.raises(ImproperlyConfigured, match="EAI_AUDIT_RETIRED_KEYS"):
        audit.trusted_keys()
    settings.EAI_AUDIT_RETIRED_KEYS = [base64.b64encode(b"x" * 31).decode()]
    with pytest.raises(ImproperlyConfigured):
        audit.trusted_keys()
    with pytest.raises(SystemCheckError, match="eai.E020"):
        call_command("check")
    settings.EAI_AUDIT_RETIRED_KEYS = [public_of(new_key())]
    call_command("check")


def test_a_rehashed_head_after_a_checkpoint_is_caught(alice, settings, tmp_path):
    """Rewriting the checkpointed entry and re-hashing consistently (head row moved
    too) passes every link check; only the signed head catches it."""
    grow(alice, 2)
    signed = checkpoint(alice.key.tenant)
    forget_anchors(settings, tmp_path)
    with tenant_scope(alice.key.tenant, readonly=True):
        last = AuditEvent.objects.for_tenant(alice.key.tenant).get(seq=signed.seq)
    body = json.loads(last.canonical)
    body["payload"]["forged"] = True
    canonical = rfc8785.dumps(body)
    new_hash = audit.link_hash(last.prev_hash, last.seq, canonical)
    tenant = alice.key.tenant
    tid = tenant.pk.hex if connection.vendor == "sqlite" else str(tenant.pk)
    tamper(
        tenant,
        "UPDATE gateway_auditevent SET canonical = %s, hash = %s WHERE id = %s",
        [canonical.decode(), new_hash, last.pk],
    )
    tamper(
        tenant, "UPDATE gateway_tenantlog SET audit_hash = %s WHERE tenant_id = %s", [new_hash, tid]
    )
    result = verify(tenant)
    assert (result["valid"], result["first_invalid_seq"]) == (False, signed.seq)
    assert result["proven_through_seq"] == 0


def test_the_admin_banner_says_what_the_checkpoints_prove_and_what_they_do_not_yet(
    alice, tenant_a, tenant_b
):
    grow(alice)
    signed = checkpoint(tenant_a)
    grow(alice)
    client = browser(staff("rita", tenant_a))
    html = client.get("/admin/gateway/auditevent/").content.decode()
    assert "Audit chain: valid" in html
    assert f"proven through seq {signed.seq} by signed checkpoints" in html
    assert "covered by the next signed checkpoint (every 5 minutes)" in html
    # A forged checkpoint row turns the banner red.
    with tenant_scope(tenant_a):
        AuditCheckpoint.objects.filter(pk=signed.pk).update(key_id="0000000000000000")
    html = client.get("/admin/gateway/auditevent/").content.decode()
    assert "Audit chain: INVALID" in html
    assert f"first invalid seq <strong>{signed.seq}</strong>" in html
