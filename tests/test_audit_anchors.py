"""The audit chain proves itself outside the database: checkpoints count only when a
trusted key signed them, and each is also in an anchor log the database owner cannot
reach, so truncating the chain behind forged, deleted or rolled-back checkpoint rows is
caught. Tampering here is done as the tables' owner on PostgreSQL (append-only trigger
switched off) and by editing the SQLite file directly, as an attacker would."""

import base64
import io
import json
import multiprocessing
import os
import sqlite3

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from gateway import audit
from gateway.models import AuditCheckpoint, AuditEvent
from tenants.scope import tenant_scope

pytestmark = pytest.mark.django_db(transaction=True)

UNKNOWN_KEY = "0000000000000000"
JUNK_SIGNATURE = base64.b64encode(b"\x01" * 64).decode()


def as_owner(tenant, *statements):
    """Run `(sql, params)` statements (`%s` placeholders) behind the application's back:
    on PostgreSQL as the tables' owner with the append-only trigger switched off; on
    SQLite through a connection of our own to the database file."""
    if connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant.pk)])
            cursor.execute(
                "ALTER TABLE gateway_auditevent DISABLE TRIGGER gateway_auditevent_append_only"
            )
            for sql, params in statements:
                cursor.execute(sql, params)
            cursor.execute(
                "ALTER TABLE gateway_auditevent ENABLE TRIGGER gateway_auditevent_append_only"
            )
        return
    raw = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
    try:
        for sql, params in statements:
            raw.execute(sql.replace("%s", "?"), params)
        raw.commit()
    finally:
        raw.close()


def tid(tenant):
    return tenant.pk.hex if connection.vendor == "sqlite" else str(tenant.pk)


def grow(api, calls=1):
    for _ in range(calls):
        assert api.invoke("jira.search", {"q": "x"}).status_code == 200


def chain(tenant):
    with tenant_scope(tenant, readonly=True):
        return list(
            AuditEvent.objects.for_tenant(tenant).order_by("seq").values_list("seq", "hash")
        )


def checkpoint(tenant):
    with tenant_scope(tenant):
        return audit.write_checkpoint(tenant)


def verify(tenant, **kw):
    with tenant_scope(tenant, readonly=True):
        return audit.verify_chain(tenant, **kw)


def truncate_to(tenant, seq, *more):
    """Delete the entries after `seq` and move the head back onto `seq`."""
    head_hash = dict(chain(tenant))[seq]
    as_owner(
        tenant,
        ("DELETE FROM gateway_auditevent WHERE tenant_id = %s AND seq > %s", [tid(tenant), seq]),
        (
            "UPDATE gateway_tenantlog SET audit_seq = %s, audit_hash = %s WHERE tenant_id = %s",
            [seq, head_hash, tid(tenant)],
        ),
        *more,
    )
    return head_hash


def assert_refused(api, tenant, first_invalid_seq):
    result = verify(tenant)
    assert result["valid"] is False
    assert result["first_invalid_seq"] == first_invalid_seq
    over_http = api.get("/v1/audit/verify").json()
    assert over_http["valid"] is False
    assert over_http["first_invalid_seq"] == first_invalid_seq
    with pytest.raises(CommandError):
        call_command("verify_audit", "--tenant", tenant.slug, stdout=io.StringIO())


def assert_bob_untouched(bob):
    result = bob.get("/v1/audit/verify").json()
    assert result["valid"] is True and result["length"] > 0


def test_a_truncation_behind_a_forged_checkpoint_is_invalid(alice, bob):
    tenant = alice.key.tenant
    grow(alice, 3)
    grow(bob)
    signed = checkpoint(tenant)
    keep = signed.seq - 4
    keep_hash = dict(chain(tenant))[keep]
    truncate_to(
        tenant,
        keep,
        (
            "UPDATE gateway_auditcheckpoint SET seq = %s, head_hash = %s, key_id = %s,"
            " signature = %s WHERE id = %s",
            [keep, keep_hash, UNKNOWN_KEY, JUNK_SIGNATURE, signed.pk],
        ),
    )
    # The forged row claims `keep`; the anchor log still says `signed.seq`.
    assert_refused(alice, tenant, keep)
    assert_bob_untouched(bob)


def test_a_forged_checkpoint_row_alone_is_invalid_never_skipped(alice, bob):
    tenant = alice.key.tenant
    grow(alice, 2)
    length = len(chain(tenant))
    head_hash = dict(chain(tenant))[length]
    # No anchor for it, a real head: only the key decides.
    as_owner(
        tenant,
        (
            "INSERT INTO gateway_auditcheckpoint (tenant_id, seq, head_hash, signature, key_id,"
            " created_at) VALUES (%s, %s, %s, %s, %s, %s)",
            [tid(tenant), length, head_hash, JUNK_SIGNATURE, UNKNOWN_KEY, "2026-01-01 00:00:00"],
        ),
    )
    assert_refused(alice, tenant, length)
    assert_bob_untouched(bob)


def test_deleted_checkpoint_rows_do_not_hide_a_truncation(alice, bob):
    tenant = alice.key.tenant
    grow(alice, 3)
    signed = checkpoint(tenant)
    keep = signed.seq - 3
    truncate_to(
        tenant,
        keep,
        ("DELETE FROM gateway_auditcheckpoint WHERE tenant_id = %s", [tid(tenant)]),
    )
    with tenant_scope(tenant, readonly=True):
        assert not AuditCheckpoint.objects.for_tenant(tenant).exists()
    assert_refused(alice, tenant, keep + 1)  # the first entry the anchor vouches for and lacks
    assert verify(tenant)["proven_through_seq"] == 0
    assert_bob_untouched(bob)


def test_a_rolled_back_checkpoint_is_invalid(alice, bob):
    tenant = alice.key.tenant
    grow(alice)
    first = checkpoint(tenant)
    grow(alice, 2)
    second = checkpoint(tenant)
    assert second.seq > first.seq
    # Back to the state of the first checkpoint, as a restored backup would be.
    truncate_to(
        tenant,
        first.seq,
        ("DELETE FROM gateway_auditcheckpoint WHERE id = %s", [second.pk]),
    )
    assert_refused(alice, tenant, first.seq + 1)
    result = verify(tenant)
    assert result["proven_through_seq"] == first.seq  # what the first one still proves
    assert_bob_untouched(bob)


def test_verify_audit_checks_an_exported_copy_of_the_anchors(alice, bob, settings, tmp_path):
    tenant = alice.key.tenant
    grow(alice, 3)
    grow(bob)
    out = io.StringIO()
    call_command("audit_checkpoints", "--export", stdout=out)
    exported = tmp_path / "auditor-copy.jsonl"
    exported.write_text(out.getvalue())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {line["tenant"] for line in lines} == {tenant.public_id, bob.key.tenant.public_id}
    signed = max(line["seq"] for line in lines if line["tenant"] == tenant.public_id)
    call_command("verify_audit", "--anchors", str(exported), stdout=io.StringIO())

    truncate_to(
        tenant,
        signed - 3,
        ("DELETE FROM gateway_auditcheckpoint WHERE tenant_id = %s", [tid(tenant)]),
    )
    # The gateway's own anchor log is out of reach too: only the auditor's copy is left.
    os.unlink(settings.EAI_AUDIT_ANCHOR_PATH)
    call_command("verify_audit", "--tenant", tenant.slug, stdout=io.StringIO())
    out = io.StringIO()
    with pytest.raises(CommandError, match="acme"):
        call_command("verify_audit", "--anchors", str(exported), stdout=out)
    results = {r["tenant"]: r for r in map(json.loads, out.getvalue().splitlines())}
    assert results["acme"]["valid"] is False
    assert results["acme"]["first_invalid_seq"] == signed - 2
    assert results["globex"]["valid"] is True
    assert results["globex"]["proven_through_seq"] == results["globex"]["length"]


def test_verify_audit_refuses_an_anchors_file_it_cannot_read(alice, tmp_path):
    with pytest.raises(CommandError, match="anchors file"):
        call_command("verify_audit", "--anchors", str(tmp_path / "missing.jsonl"))


def test_verify_audit_accepts_full_and_says_what_is_not_covered_yet(alice, capsys):
    grow(alice)
    checkpoint(alice.key.tenant)
    grow(alice)
    call_command("verify_audit", "--full", "--tenant", "acme")
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["valid"] is True
    assert 0 < result["proven_through_seq"] < result["length"]
    assert "Entries after proven_through_seq are covered by the next signed checkpoint" in (
        captured.err
    )
    assert "every 5 minutes" in captured.err


# ------------------------------------------------------------------ the log itself


def anchor_lines(settings):
    with open(settings.EAI_AUDIT_ANCHOR_PATH) as log:
        return [json.loads(line) for line in log]


def test_each_checkpoint_is_appended_to_the_anchor_log(alice, bob, settings):
    grow(alice)
    first = checkpoint(alice.key.tenant)
    assert checkpoint(alice.key.tenant) is None  # the head is already checkpointed
    call_command("audit_checkpoints", stdout=io.StringIO())
    lines = anchor_lines(settings)
    assert [(line["tenant"], line["seq"]) for line in lines] == [
        (alice.key.tenant.public_id, first.seq),
        (bob.key.tenant.public_id, bob.get("/v1/audit/verify").json()["length"]),
    ]
    assert lines[0]["head_hash"] == first.head_hash
    assert lines[0]["signature"] == first.signature
    assert lines[0]["key_id"] == audit.key_id()
    assert lines[0]["public_key"] == audit.public_key_b64()
    assert oct(os.stat(settings.EAI_AUDIT_ANCHOR_PATH).st_mode & 0o777) == "0o600"


def test_a_failed_append_leaves_no_checkpoint(alice, settings, tmp_path):
    grow(alice)
    settings.EAI_AUDIT_ANCHOR_PATH = str(tmp_path / "no-such-dir" / "anchors.jsonl")
    with pytest.raises(OSError):
        checkpoint(alice.key.tenant)
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not AuditCheckpoint.objects.exists()


def test_a_line_signed_by_an_unknown_key_makes_the_chain_invalid(alice, bob, settings):
    tenant = alice.key.tenant
    grow(alice)
    genuine = checkpoint(tenant)  # the same head, signed by the trusted key: no excuse
    head = chain(tenant)[-1]
    assert head == (genuine.seq, genuine.head_hash)
    forged = {"tenant": tenant.public_id, "seq": head[0], "head_hash": head[1]}
    with open(settings.EAI_AUDIT_ANCHOR_PATH, "a") as log:
        log.write(json.dumps({**forged, "key_id": UNKNOWN_KEY, "signature": JUNK_SIGNATURE}))
        log.write("\n")
    assert_refused(alice, tenant, head[0])
    assert verify(tenant)["proven_through_seq"] == 0  # nothing from the invalid entry on
    assert_bob_untouched(bob)


def test_a_damaged_line_makes_its_tenants_chain_unproven(alice, bob, settings):
    grow(alice)
    grow(bob)
    checkpoint(alice.key.tenant)
    checkpoint(bob.key.tenant)
    with open(settings.EAI_AUDIT_ANCHOR_PATH, "a") as log:
        log.write('{"tenant": "' + alice.key.tenant.public_id + '", "seq": 1,,}\n')
        log.write("{not json, and naming no tenant\n")
    with pytest.raises(audit.AnchorLogDamaged, match="line 3 "):
        audit.read_anchors(alice.key.tenant)
    assert_refused(alice, alice.key.tenant, 1)
    assert verify(alice.key.tenant)["proven_through_seq"] == 0
    # Lines naming nobody, or another tenant, are no evidence about this chain.
    assert_bob_untouched(bob)
    assert len(audit.read_anchors(bob.key.tenant)) == 1


@pytest.mark.parametrize(
    "line",
    [
        {"seq": "3"},
        {"seq": True},
        {"head_hash": None},
        {"key_id": 1},
        {"signature": ["x"]},
    ],
)
def test_a_line_of_the_wrong_shape_is_damage(alice, settings, line):
    grow(alice)
    signed = checkpoint(alice.key.tenant)
    good = anchor_lines(settings)[0]
    with open(settings.EAI_AUDIT_ANCHOR_PATH, "a") as log:
        log.write(json.dumps({**good, **line}) + "\n")
    with pytest.raises(audit.AnchorLogDamaged):
        audit.read_anchors(alice.key.tenant)
    assert verify(alice.key.tenant)["valid"] is False
    assert signed is not None


def test_a_torn_last_line_is_skipped_then_cut_by_the_next_append(alice, bob, settings):
    grow(alice)
    checkpoint(alice.key.tenant)
    with open(settings.EAI_AUDIT_ANCHOR_PATH, "a") as log:
        log.write('{"tenant": "' + alice.key.tenant.public_id + '", "seq": 99')  # a crash
    assert verify(alice.key.tenant)["valid"] is True
    grow(bob)
    checkpoint(bob.key.tenant)
    lines = anchor_lines(settings)
    assert [line["tenant"] for line in lines] == [
        alice.key.tenant.public_id,
        bob.key.tenant.public_id,
    ]
    assert verify(alice.key.tenant)["valid"] is True
    assert verify(bob.key.tenant)["valid"] is True


@pytest.mark.parametrize("torn", [b'{"tenant": "ten_', b"x" * 9000])
@pytest.mark.parametrize("before", [0, 1, 3])
def test_the_next_append_cuts_only_the_torn_tail(db, settings, torn, before):
    """Whatever the length of the unfinished line (longer than one read of 4 KiB, or
    the whole file), the whole lines before it stay and the new one follows them."""
    for n in range(before):
        audit.append_anchor({"tenant": "ten_x", "seq": n + 1, "pad": "y" * 2000})
    with open(settings.EAI_AUDIT_ANCHOR_PATH, "ab") as log:
        log.write(torn)
    audit.append_anchor({"tenant": "ten_x", "seq": 99})
    assert [line["seq"] for line in anchor_lines(settings)] == [*range(1, before + 1), 99]


def _append_many(path, writer, count):
    for n in range(count):
        audit.append_anchor({"tenant": f"ten_{writer}", "seq": n + 1, "pad": "x" * 3000})


def test_processes_appending_together_leave_whole_lines(db, settings):
    path = settings.EAI_AUDIT_ANCHOR_PATH
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(path, w, 40)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    lines = anchor_lines(settings)
    assert len(lines) == 160
    for writer in range(4):
        seqs = [line["seq"] for line in lines if line["tenant"] == f"ten_{writer}"]
        assert seqs == list(range(1, 41))
