"""The hash-chained audit log: linear under concurrency, append-only, verifiable, and
every decision and mutation recorded with its change."""

import io
import json
import threading
import uuid
from datetime import datetime
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gateway import audit
from gateway.models import (
    AuditCheckpoint,
    AuditEvent,
    Event,
    Invocation,
    Run,
    UsageEvent,
    new_id,
)
from tenants.scope import tenant_scope

from .conftest import error_of, scope, tamper


def run_together(target, count, timeout=None):
    """`target(0)` … `target(count - 1)` on threads started together; wait for all."""
    threads = [threading.Thread(target=target, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)


def actions(tenant):
    with tenant_scope(tenant, readonly=True):
        return list(
            AuditEvent.objects.for_tenant(tenant).order_by("seq").values_list("action", flat=True)
        )


def test_it_audits_decisions_invocations_keys_and_manifests(alice):
    tenant = alice.key.tenant
    before = actions(tenant)
    assert before.count("manifest.apply") == 3 and "apikey.created" in before
    alice.invoke("jira.search", {"q": "x"})
    alice.invoke("secret.tool", {})
    alice.invoke("payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"})
    after = actions(tenant)[len(before) :]
    assert after == [
        "policy.decision",
        "dlp.redact",  # jira's output holds an IBAN
        "tool.invoke",
        "policy.decision",
        "tool.invoke",
        "policy.decision",
        "dlp.redact",  # the transfer's input holds one too
        "approval.requested",
    ]


def test_it_exposes_the_chain_and_verifies_it(alice):
    alice.invoke("jira.search", {"q": "x"})
    page = alice.get("/v1/audit/events", limit=2).json()
    assert [e["seq"] for e in page["results"]] == [1, 2]
    first = page["results"][0]
    assert set(first) == {
        "seq",
        "action",
        "actor",
        "object_ref",
        "created_at",
        "payload",
        "prev_hash",
        "hash",
    }
    assert first["prev_hash"] == "0" * 64
    assert page["results"][1]["prev_hash"] == first["hash"]
    with tenant_scope(alice.key.tenant, readonly=True):
        stored = AuditEvent.objects.for_tenant(alice.key.tenant).get(seq=1).canonical
    assert first["payload"] == json.loads(stored)["payload"] != {}  # the hashed payload
    rest = alice.get("/v1/audit/events", cursor=page["next_cursor"], limit=500).json()
    assert rest["results"][0]["seq"] == 3 and rest["next_cursor"] is None
    result = alice.get("/v1/audit/verify").json()
    assert result == {
        "valid": True,
        "length": result["length"],
        "head_hash": rest["results"][-1]["hash"],
        "first_invalid_seq": None,
        "proven_through_seq": 0,  # no checkpoint yet
        "last_full_verification_at": result["last_full_verification_at"],
        "unproven_entries": result["length"],  # none is under a checkpoint yet
        "coverage": result["coverage"],
    }
    assert "covered by the next signed checkpoint (every 5 minutes)" in result["coverage"]
    assert result["length"] == 2 + len(rest["results"])
    french = alice.get("/v1/audit/verify", {"Accept-Language": "fr"}).json()["coverage"]
    assert "prochain point de contrôle signé (toutes les 5 minutes)" in french


def test_its_payloads_hold_no_raw_input_or_output(alice):
    alice.invoke("jira.search", {"q": "INC-SECRET-QUERY"})
    with tenant_scope(alice.key.tenant, readonly=True):
        events = list(AuditEvent.objects.all())
    assert len(events) >= 2  # the decision and the call, at least
    for event in events:
        assert "INC-SECRET-QUERY" not in event.canonical
        assert "FR7630006000011234567890189" not in event.canonical


def test_bob_sees_only_his_chain(alice, bob):
    alice.invoke("jira.search", {"q": "x"})
    bob_events = bob.get("/v1/audit/events", limit=500).json()["results"]
    assert all(e["object_ref"] != alice.key.public_id for e in bob_events)
    assert bob.get("/v1/audit/verify").json()["length"] == len(bob_events)


@pytest.mark.parametrize("seam", ["record", "record_with_rows"])
def test_it_fails_the_call_when_the_audit_write_fails(alice, seam):
    if seam == "record" and connection.vendor == "postgresql":
        pytest.skip("on PostgreSQL the invoke path writes through record_with_rows")
    with mock.patch.object(audit, seam, side_effect=DatabaseError("disk full")):
        response = alice.invoke("jira.search", {"q": "x"})
    assert response.status_code == 503
    error = error_of(response)
    assert error["code"] == "audit_unavailable"
    assert "output" not in response.json()
    with scope(alice.key.tenant):
        assert not Invocation.objects.exists()


def test_it_refuses_updates_and_deletes_through_the_orm(alice):
    with tenant_scope(alice.key.tenant, readonly=True):
        event = AuditEvent.objects.first()
    event.action = "forged"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    with pytest.raises(PermissionError), scope(alice.key.tenant):
        AuditEvent.objects.filter(pk=event.pk).update(action="forged")
    with pytest.raises(PermissionError), scope(alice.key.tenant):
        AuditEvent.objects.all().delete()


@pytest.mark.django_db(transaction=True)
def test_eight_threads_appending_leave_a_linear_chain(alice):
    tenant = alice.key.tenant
    errors = []

    def append(n):
        try:
            for i in range(15):
                with tenant_scope(tenant):
                    audit.record(tenant, [audit.Entry("test.append", f"t{n}", f"obj{i}", {"i": i})])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    run_together(append, 8)
    assert errors == []
    with tenant_scope(tenant, readonly=True):
        rows = AuditEvent.objects.for_tenant(tenant).order_by("seq")
        seqs = list(rows.values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert actions(tenant).count("test.append") == 120
    with tenant_scope(tenant, readonly=True):
        assert audit.verify_chain(tenant)["valid"] is True


def _tamper(tenant, sql, params):
    """Edit stored rows as the database owner would (bypassing the ORM guard)."""
    tamper(tenant, sql, params)


@pytest.mark.parametrize("column", ["canonical", "action", "hash", "prev_hash"])
def test_editing_any_stored_event_is_named_by_verify(alice, column):
    tenant = alice.key.tenant
    alice.invoke("jira.search", {"q": "x"})
    with scope(alice.key.tenant):
        target = AuditEvent.objects.for_tenant(tenant).order_by("seq")[2]
    if column == "canonical":
        body = json.loads(target.canonical)
        body["payload"]["tampered"] = True
        value = json.dumps(body)
    else:
        value = "f" * 64 if column in ("hash", "prev_hash") else "forged"
    sql = f"UPDATE gateway_auditevent SET {column} = %s WHERE id = %s"  # noqa: S608 (fixed names)
    _tamper(tenant, sql, [value, target.pk])
    with tenant_scope(tenant, readonly=True):
        result = audit.verify_chain(tenant)
    assert result["valid"] is False
    assert result["first_invalid_seq"] == target.seq
    with pytest.raises(CommandError):
        call_command("verify_audit", "--tenant", tenant.slug, stdout=io.StringIO())


def test_a_truncated_tail_is_caught_by_the_head_row(alice, bob):
    """Deleting the last entries leaves a chain whose every link holds: only the head
    row (seq and hash of the last entry written) says entries are missing."""
    tenant = alice.key.tenant
    alice.invoke("jira.search", {"q": "x"})
    bob.invoke("jira.search", {"q": "x"})
    with tenant_scope(tenant, readonly=True):
        length = AuditEvent.objects.for_tenant(tenant).count()
    _tamper(
        tenant,
        "DELETE FROM gateway_auditevent WHERE tenant_id = %s AND seq > %s",
        [tenant.pk.hex if connection.vendor == "sqlite" else tenant.pk, length - 2],
    )
    with tenant_scope(tenant, readonly=True):
        result = audit.verify_chain(tenant)
    assert result["valid"] is False
    assert result["length"] == length - 2
    assert result["first_invalid_seq"] == length - 1
    with tenant_scope(bob.key.tenant, readonly=True):
        assert audit.verify_chain(bob.key.tenant)["valid"] is True


def test_a_link_rehashed_over_a_wrong_prev_hash_is_invalid(alice):
    """Every link from `seq` on re-hashed consistently over a prev_hash that is not its
    predecessor's hash, the head row moved: each link's own hash holds, only the
    prev_hash comparison catches it."""
    tenant = alice.key.tenant
    alice.invoke("jira.search", {"q": "x"})
    with tenant_scope(tenant, readonly=True):
        rows = list(AuditEvent.objects.for_tenant(tenant).order_by("seq"))
    target = rows[2]
    prev = "e" * 64
    for row in rows[2:]:
        digest = audit.link_hash(prev, row.seq, row.canonical.encode())
        _tamper(
            tenant,
            "UPDATE gateway_auditevent SET prev_hash = %s, hash = %s WHERE id = %s",
            [prev, digest, row.pk],
        )
        prev = digest
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE gateway_tenantlog SET audit_hash = %s WHERE tenant_id = %s",
            [prev, tenant.pk.hex if connection.vendor == "sqlite" else tenant.pk],
        )
    with tenant_scope(tenant, readonly=True):
        result = audit.verify_chain(tenant)
    assert (result["valid"], result["first_invalid_seq"]) == (False, target.seq)
    assert result["head_hash"] == prev


def test_a_rehashed_tail_is_caught_by_a_signed_checkpoint(alice):
    tenant = alice.key.tenant
    with tenant_scope(tenant):
        checkpoint = audit.write_checkpoint(tenant)
        assert checkpoint is not None and AuditCheckpoint.objects.count() == 1
        # Rewrite the last link and re-hash it consistently, as a superuser could.
        last = AuditEvent.objects.for_tenant(tenant).order_by("-seq").first()
    body = json.loads(last.canonical)
    body["payload"]["scopes"] = ["everything:*"]
    import rfc8785

    canonical = rfc8785.dumps(body)
    new_hash = audit.link_hash(last.prev_hash, last.seq, canonical)
    _tamper(
        tenant,
        "UPDATE gateway_auditevent SET canonical = %s, hash = %s WHERE id = %s",
        [canonical.decode(), new_hash, last.pk],
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE gateway_tenantlog SET audit_hash = %s WHERE tenant_id = %s",
            [new_hash, tenant.pk.hex if connection.vendor == "sqlite" else tenant.pk],
        )
    with tenant_scope(tenant, readonly=True):
        result = audit.verify_chain(tenant)
    assert result["valid"] is False
    assert result["first_invalid_seq"] == checkpoint.seq


def test_the_database_refuses_updates_on_postgresql(alice):
    if connection.vendor != "postgresql":
        pytest.skip("the append-only trigger is PostgreSQL's")

    scope = alice.key.tenant  # the rows must be visible for the trigger to see them
    with pytest.raises(DatabaseError), tenant_scope(scope), connection.cursor() as cursor:
        cursor.execute("UPDATE gateway_auditevent SET action = 'forged'")
    with pytest.raises(DatabaseError), tenant_scope(scope), connection.cursor() as cursor:
        cursor.execute("DELETE FROM gateway_auditevent")


def test_checkpoints_are_signed_and_exportable(alice, capsys):
    call_command("audit_checkpoints", "--tenant", alice.key.tenant.slug, "--export")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 1
    assert set(lines[0]) >= {"tenant", "seq", "head_hash", "signature", "public_key"}
    with tenant_scope(alice.key.tenant, readonly=True):
        stored = AuditCheckpoint.objects.for_tenant(alice.key.tenant).get()
    assert lines[0]["created_at"] == stored.created_at.isoformat()
    assert lines[0]["key_id"] == stored.key_id == audit.key_id()
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(lines[0]["public_key"]))
    import rfc8785

    public.verify(
        base64.b64decode(lines[0]["signature"]),
        rfc8785.dumps({k: lines[0][k] for k in ("tenant", "seq", "head_hash")}),
    )


def test_verify_audit_loops_over_every_tenant(alice, bob, capsys):
    call_command("verify_audit")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["tenant"] for line in lines} == {"acme", "globex"}
    assert all(line["valid"] for line in lines)


JCS_CASES = [
    {},
    [],
    {"b": 1, "a": [True, False, None], "c": {"z": "", "y": -0}},
    {"quote": 'say "hi" \\ back', "controls": "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1f\x7f"},
    {"max": 2**53 - 1, "min": -(2**53 - 1), "zero": 0, "neg": -17},
    {"edge": 2**53},
    {"big": 2**53 + 1},  # beyond I-JSON: the reference decides (refuses)
    {"float": 1.0, "tiny": 1e-7, "huge": 1e21, "pi": 3.141592653589793},
    {"in a list": [1, 1e-7], "in a tuple": ("x", 1e-7)},  # the C encoder writes 1e-07
    {"fr": "Événement créé à l'échéance", "€": "montant"},
    {"astral": "\U0001f600", "\ue000": 1, "\U00010000": 2},  # UTF-16 vs code point order
    {"line": "\u2028\u2029", "nested": [[[{"k": ["v", 1, {"x": None}]}]]]},
    {"tuple": (1, "two"), "keys": {"B": 1, "a": 2, "_": 3, "1": 4, "": 5}},
]


@pytest.mark.parametrize("value", JCS_CASES)
def test_the_fast_canonical_form_is_byte_for_byte_rfc_8785(value):
    import rfc8785

    try:
        expected = rfc8785.dumps(value)
    except Exception as exc:  # noqa: BLE001 - whatever the reference refuses, we refuse
        with pytest.raises(type(exc)):
            audit.jcs(value)
        return
    assert audit.jcs(value) == expected


@pytest.mark.django_db(transaction=True)
def test_sqlite_writers_queue_and_release_the_queue_on_commit_rollback_and_error(tenant_a):
    if connection.vendor != "sqlite":
        pytest.skip("the in-process writer queue is the embedded SQLite default's")
    import time

    from django.db import transaction

    from eai.sqlite import base as sqlite_base
    from tenants.scope import tenant_scope

    with pytest.raises(RuntimeError), transaction.atomic():
        raise RuntimeError("rolled back")
    with transaction.atomic():
        pass
    assert not sqlite_base._WRITER.locked()  # released after rollback and commit

    waits: list[float] = []

    def append(index: int) -> None:
        try:
            for _ in range(5):
                started = time.monotonic()
                with tenant_scope(tenant_a):
                    waits.append(time.monotonic() - started)
                    audit.record(tenant_a, [audit.Entry("test.append", f"t{index}", "x", {})])
        finally:
            connection.close()

    run_together(append, 12, timeout=60)
    assert len(waits) == 60
    assert max(waits) < 5  # queued in the process, not left to SQLite's sleeping retries
    with scope(tenant_a):
        assert audit.verify_chain(tenant_a)["valid"] is True
    assert not sqlite_base._WRITER.locked()


def test_the_raw_insert_stores_what_the_orm_would(db):
    """`audit._insert` (the write of the embedded database's hot path) skips the ORM's
    save(); the rows it stores must equal, column for column, those save() stores."""
    from datetime import UTC, datetime
    from decimal import Decimal
    from zoneinfo import ZoneInfo

    from gateway.models import Decision, Event, UsageEvent
    from tenants.models import Tenant

    tenant = Tenant.objects.create(slug="raw-insert", name="Raw insert")
    when = datetime(2026, 11, 30, 7, 8, 9, 123456, tzinfo=UTC)

    def pair(model, tag="", **fields):
        return [model(id=f"{prefix}_{model.__name__.lower()}{tag}", **fields) for prefix in "ab"]

    groups = [
        pair(
            Decision,
            tenant=tenant,
            tool="t",
            tool_version="1",
            allow=True,
            reasons=["r", "é"],
            obligations=[],
            policy_version="p",
            input_digest="d",
            api_key_id="k",
            created_at=when,
        ),
        pair(
            Invocation,
            tenant=tenant,
            tool="t",
            tool_version="1",
            tool_revision=3,
            status="succeeded",
            input={"iban": "FR76…", "n": 1},
            decision_id="a_decision",  # a foreign key to a text primary key
            sealed_input=b"\x00\x01sealed",
            output=None,
            error={"code": "x"},
            cost_amount=Decimal("0.120000"),
            cost_currency="EUR",
            step_index=None,
            created_at=when,
            started_at=when,
            finished_at=None,
        ),
        pair(UsageEvent, tenant=tenant, amount=Decimal("1.5"), tool="t", occurred_at=when),
        # A time zone other than UTC, and JSON that is not a dict or a list: the slow path.
        pair(
            Decision,
            tag="paris",
            tenant=tenant,
            tool="t",
            tool_version="1",
            allow=False,
            reasons="not a list",
            obligations=[{"type": "dlp", "entities": ["IBAN"]}],
            policy_version="p",
            input_digest="d",
            api_key_id="k",
            created_at=when.astimezone(ZoneInfo("Europe/Paris")),
        ),
        pair(
            Event,
            tenant=tenant,
            sequence=7,
            type="agent.tool.completed",
            refs={},
            payload={"output": None, "x": [1, 2.5, True]},
            created_at=when,
        ),
    ]
    groups[-1][1].sequence = 8  # the feed's sequence is unique per tenant
    links = [
        AuditEvent(
            tenant=tenant,
            seq=seq,
            action="a",
            actor="k",
            object_ref="o",
            canonical="{}",
            prev_hash=f"p{seq}",
            hash=f"h{seq}",
            created_at=when,
        )
        for seq in (1, 2)
    ]
    skip = {"id", "sequence", "seq", "prev_hash", "hash"}  # what differs on purpose
    with tenant_scope(tenant):
        for orm_row, raw_row in [*groups, links]:
            orm_row.save(force_insert=True)
            audit._insert([raw_row])  # the link's id is left to the database, as the ORM's
        with connection.cursor() as cursor:
            for orm_row, raw_row in [*groups, links]:
                table = orm_row._meta.db_table  # a model's table name, not input
                key = "seq" if isinstance(orm_row, AuditEvent) else "id"
                # As text: the exact stored form (SQLite compares datetimes as text).
                columns = [f.column for f in orm_row._meta.concrete_fields if f.column not in skip]
                select = ", ".join(f"CAST({c} AS TEXT)" for c in columns)
                stored = []
                for row in (orm_row, raw_row):
                    sql = f"SELECT {select} FROM {table} WHERE {key} = %s"  # noqa: S608
                    cursor.execute(sql, [getattr(row, key)])
                    stored.append(dict(zip(columns, cursor.fetchone(), strict=True)))
                assert stored[0] == stored[1], table


@pytest.mark.django_db
def test_sqlite_connections_run_in_wal_mode_and_checkpoint_every_4000_pages():
    if connection.vendor != "sqlite":
        pytest.skip("the embedded SQLite default's settings")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone()[0] == 4000
        cursor.execute("PRAGMA synchronous")
        assert cursor.fetchone()[0] == 1  # NORMAL


def test_a_changed_time_zone_setting_forgets_the_cached_insert_statements(db, settings):
    from gateway.models import Decision

    audit._insert_statement(Decision, "", False, connection.vendor)
    assert audit._insert_statement.cache_info().currsize > 0
    settings.TIME_ZONE = "Europe/Paris"
    assert audit._insert_statement.cache_info().currsize == 0


def test_the_raw_insert_can_ignore_a_conflict(db):
    from gateway.models import Run
    from tenants.models import Tenant

    tenant = Tenant.objects.create(slug="raw-conflict", name="Raw conflict")
    with tenant_scope(tenant):
        audit._insert([Run(tenant=tenant, run_id="r1", agent="a")], ignore_conflicts=True)
        audit._insert([Run(tenant=tenant, run_id="r1", agent="b")], ignore_conflicts=True)
        assert list(Run.objects.filter(tenant=tenant).values_list("agent", flat=True)) == ["a"]
        with pytest.raises(DatabaseError), transaction.atomic():
            audit._insert([Run(tenant=tenant, run_id="r1", agent="c")])


def test_row_of_gives_every_column_as_json_reads_it(alice):
    """The rows `eai_record_call` inserts: dates, decimals and uuids as text, JSON
    values as they are, a deferred field loaded, no auto-increment id."""
    alice.invoke("jira.search", {"q": "x"})
    tenant = alice.key.tenant
    with tenant_scope(tenant):
        invocation = Invocation.objects.for_tenant(tenant).latest("id")
        deferred = Invocation.objects.for_tenant(tenant).defer("output").get(pk=invocation.pk)
        deferred_row = audit.row_of(deferred)  # loads `output`: inside the tenant's scope
        checkpoint = AuditCheckpoint(tenant=tenant, seq=1, head_hash="0" * 64, signature="s")
    row = audit.row_of(invocation)
    assert row["id"] == invocation.id and row["tenant_id"] == str(tenant.pk)
    assert row["created_at"] == invocation.created_at.isoformat()
    assert row["cost_amount"] == str(invocation.cost_amount)
    assert row["output"] == invocation.output and isinstance(row["output"], dict)
    assert row["run_id"] == "" and row["step_index"] is None
    assert deferred_row == row
    assert set(row) == {f.column for f in Invocation._meta.concrete_fields}
    assert "id" not in audit.row_of(checkpoint)  # the database numbers it
    assert json.loads(json.dumps(row)) == row
    # A binary column (a sealed input) in bytea's hex input form, from bytes or a view.
    assert audit._column_value(b"\x00\x9f") == "\\x009f"
    assert audit._column_value(memoryview(b"\xff")) == "\\xff"


def test_the_fast_conversions_apply_where_they_are_known(db):
    """The raw insert skips get_db_prep_save only where its result is known (another
    test checks the values are the same): on SQLite with USE_TZ, for datetimes, JSON and
    foreign keys to uuid or text keys; elsewhere only for values passed as they are."""
    created = AuditEvent._meta.get_field("created_at")
    tenant_fk = AuditEvent._meta.get_field("tenant")
    payload = Invocation._meta.get_field("output")
    for field, kind in ((created, datetime), (tenant_fk, uuid.UUID), (payload, dict)):
        kinds, convert = audit._fast_conversion(field, "sqlite")
        assert kind in kinds and convert is not None, field
        assert audit._fast_conversion(field, "postgresql") == (frozenset(), None), field
    kinds, convert = audit._fast_conversion(AuditEvent._meta.get_field("action"), "postgresql")
    assert str in kinds and convert is None


def test_postgresql_records_and_settles_a_call_in_one_round_trip(alice):
    """On PostgreSQL a call's rows, links and events go in one statement
    (`eai_record_call`, `eai_settle_call`): the statement-by-statement path would give
    the same rows at several round trips each."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement write is PostgreSQL's")
    tenant = alice.key.tenant
    alice.invoke("jira.search", {"q": "x"})
    with tenant_scope(tenant):
        invocation = Invocation.objects.for_tenant(tenant).latest("id")
        Invocation.objects.filter(pk=invocation.pk).update(status="running")
    entry = audit.Entry("test.one_trip", "t", invocation.pk, {"n": 1})
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        audit.record_with_rows(tenant, [], [entry], [])
    assert len(queries) == 1 and "eai_record_call" in queries[0]["sql"]
    invocation.status = "failed"
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert audit.settle_with_rows(tenant, invocation, [], [entry], [])
    assert len(queries) == 1 and "eai_settle_call" in queries[0]["sql"]
    assert actions(tenant)[-2:] == ["test.one_trip", "test.one_trip"]
    with tenant_scope(tenant, readonly=True):
        assert audit.verify_chain(tenant)["valid"] is True


def test_record_appends_feed_events_alone_with_their_refs_and_bounded_payloads(alice, bob):
    tenant = alice.key.tenant
    links_before = len(actions(tenant))
    event = audit.AgentEvent(
        "agent.plan.updated",
        run_id="run_rec",
        refs={"plan": "p1"},
        payload={"step": 1, "notes": "n" * 20000},
    )
    with tenant_scope(tenant):
        audit.record(tenant, events=[event])
    assert len(actions(tenant)) == links_before  # no audit link for a feed event alone
    with tenant_scope(tenant, readonly=True):
        stored = Event.objects.for_tenant(tenant).get(run_id="run_rec")
    assert stored.id.startswith("evt_") and stored.type == "agent.plan.updated"
    assert stored.refs == {"plan": "p1"}
    assert stored.payload == {
        "step": 1,
        "notes": {"truncated": True, "size_bytes": 20002},
        "truncated": True,
    }
    assert bob.get("/v1/events", run_id="run_rec").json()["results"] == []


def test_record_cuts_long_actors_and_refs_as_the_hashed_body_does(alice):
    tenant = alice.key.tenant
    entry = audit.Entry("test.long", "a" * 300, "o" * 300, {})
    with tenant_scope(tenant):
        audit.record(tenant, [entry])
    with tenant_scope(tenant, readonly=True):
        link = AuditEvent.objects.for_tenant(tenant).get(action="test.long")
        assert audit.verify_chain(tenant)["valid"] is True
    assert link.actor == "a" * 200 and link.object_ref == "o" * 200


@pytest.mark.django_db(transaction=True)
def test_record_refuses_to_run_outside_a_transaction(tenant_a):
    assert not connection.in_atomic_block
    message = r"^audit\.record\(\) must run inside the change's transaction$"
    with pytest.raises(RuntimeError, match=message):
        audit.record(tenant_a, [audit.Entry("x", "y", "z")])
    with pytest.raises(RuntimeError, match="inside the change's transaction"):
        audit.record(tenant_a, events=[audit.AgentEvent("agent.error")])
    audit.record(tenant_a)  # nothing to record: nothing to refuse


def test_record_with_rows_writes_rows_links_and_events_together(alice, bob):
    """The write of a call (one statement on PostgreSQL, several elsewhere): rows of a
    table in a row go in together, a conflict ignored where asked (a run named twice);
    long actors cut as the hashed body cuts them."""
    tenant = alice.key.tenant

    def usage(tool):
        return UsageEvent(id=new_id("use"), tenant=tenant, unit="test_unit", tool=tool), False

    rows = [
        usage("t1"),
        usage("t2"),
        (Run(tenant=tenant, run_id="run_rows", agent="a1"), False),
        (Run(tenant=tenant, run_id="run_rows", agent="a2"), True),  # taken: ignored
        (Run(tenant=tenant, run_id="run_more", agent="a3"), True),
        usage("t3"),
    ]
    entry = audit.Entry("test.rows", "a" * 300, "o" * 300, {"n": 1})
    event = audit.AgentEvent(
        "agent.plan.updated", run_id="run_rows", refs={"r": 1}, payload={"step": 1}
    )
    with transaction.atomic():
        audit.record_with_rows(tenant, rows, [entry], [event])
    with tenant_scope(tenant, readonly=True):
        tools = UsageEvent.objects.for_tenant(tenant).filter(unit="test_unit")
        assert sorted(tools.values_list("tool", flat=True)) == ["t1", "t2", "t3"]
        runs = Run.objects.for_tenant(tenant).filter(run_id__in=["run_rows", "run_more"])
        assert sorted(runs.values_list("run_id", "agent")) == [
            ("run_more", "a3"),
            ("run_rows", "a1"),
        ]
        link = AuditEvent.objects.for_tenant(tenant).get(action="test.rows")
        stored = Event.objects.for_tenant(tenant).get(run_id="run_rows")
        assert (stored.refs, stored.payload) == ({"r": 1}, {"step": 1})
        assert stored.id.startswith("evt_")
        assert audit.verify_chain(tenant)["valid"] is True
    assert (link.actor, link.object_ref) == ("a" * 200, "o" * 200)
    shown = audit.event_view(link)
    assert shown["payload"] == {"n": 1}
    assert shown["created_at"] == link.created_at.isoformat()
    assert bob.get("/v1/events", run_id="run_rows").json()["results"] == []


@pytest.mark.parametrize("column", ["audit_seq", "audit_hash"])
def test_a_head_row_that_disagrees_on_one_column_is_invalid(alice, column):
    tenant = alice.key.tenant
    with tenant_scope(tenant, readonly=True):
        length = audit.verify_chain(tenant)["length"]
    value = length + 5 if column == "audit_seq" else "d" * 64
    # As the owner, with the tenant in scope: row-level security applies to it too.
    _tamper(
        tenant,
        f"UPDATE gateway_tenantlog SET {column} = %s WHERE tenant_id = %s",  # noqa: S608
        [value, tenant.pk.hex if connection.vendor == "sqlite" else tenant.pk],
    )
    with tenant_scope(tenant, readonly=True):
        result = audit.verify_chain(tenant)
    assert (result["valid"], result["first_invalid_seq"]) == (False, length + 1)


def test_the_earliest_break_is_the_one_named(alice):
    """A broken link at seq 2 and a forged checkpoint further on: 2 is named."""
    tenant = alice.key.tenant
    alice.invoke("jira.search", {"q": "x"})
    with tenant_scope(tenant):
        signed = audit.write_checkpoint(tenant)
        second = AuditEvent.objects.for_tenant(tenant).get(seq=2)
        AuditCheckpoint.objects.filter(pk=signed.pk).update(key_id="0000000000000000")
    _tamper(tenant, "UPDATE gateway_auditevent SET action = 'x' WHERE id = %s", [second.pk])
    with tenant_scope(tenant, readonly=True):
        result = audit.verify_chain(tenant)
    assert signed.seq > 2
    assert (result["valid"], result["first_invalid_seq"]) == (False, 2)
