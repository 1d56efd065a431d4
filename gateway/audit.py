"""The hash-chained audit log and the event feed, written together.

`record()` appends a change's audit entries and agent events inside the caller's
transaction (the one that writes the change), under a lock on the tenant's `TenantLog`
row: the chain stays linear under any concurrency, and event sequences are handed out
in commit order so a feed reader polling `sequence > N` never skips one.

Each audit link hashes the exact RFC 8785 bytes it stores, bound to its place in the
chain: hash = SHA-256("<prev_hash>:<seq>:" || canonical). The canonical body (tenant,
action, actor, object_ref, payload, created_at) is built here; seq and prev_hash are
given out under the head lock, by this module or, on PostgreSQL's hot path, by the
`eai_record_call` function, which computes the same hash. Signed checkpoints (Ed25519)
keep copies of the head, so a rewrite of the chain's tail is caught against them.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import operator
import os
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.utils import timezone

from eai.jsoncodec import transport_json
from eai.keyfiles import read_or_create
from gateway import finops
from gateway.models import AuditCheckpoint, AuditEvent, Event, TenantLog, new_id
from tenants.models import Tenant
from tenants.scope import tenant_scope

GENESIS = "0" * 64
MAX_EVENT_PAYLOAD_BYTES = 8 * 1024

EVENT_TYPES = (
    "agent.turn.started",
    "agent.plan.updated",
    "agent.tool.requested",
    "agent.tool.started",
    "agent.tool.completed",
    "agent.authorization.required",
    "agent.authorization.decided",
    "agent.turn.completed",
    "agent.error",
)


@dataclass
class Entry:
    """An audit record to append: what happened, who did it, to what."""

    action: str
    actor: str
    object_ref: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentEvent:
    """An event for the agent feed."""

    type: str
    run_id: str = ""
    invocation_id: str = ""
    refs: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)


class AuditUnavailable(Exception):
    """The audit write failed; the change it records must fail too (fail closed)."""


def link_hash(prev_hash: str, seq: int, canonical: bytes) -> str:
    return hashlib.sha256(f"{prev_hash}:{seq}:".encode() + canonical).hexdigest()


_JCS_MAX_INT = 2**53 - 1  # beyond it RFC 8785 (I-JSON) numbers are not exact integers


def _plain(value: Any) -> bool:
    """Whether `value` holds only what the standard library serializes exactly as
    RFC 8785 does: str-keyed objects, arrays, strings, booleans, null, and integers
    within ±(2**53 - 1) (no floats: their formatting differs)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_JCS_MAX_INT <= value <= _JCS_MAX_INT
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(_plain(v) for v in value)
    return False


def jcs(value: Any) -> bytes:
    """RFC 8785 canonical JSON. The pure-Python reference (rfc8785) costs ~0.1 ms a
    record; for plain values whose output is ASCII (so sorting by UTF-16 code units and
    by code points agree) the C encoder gives the same bytes, which a test checks
    against the reference."""
    if _plain(value):
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if text.isascii():
            return text.encode()
    return rfc8785.dumps(value)


def canonical_body(tenant: Tenant, entry: Entry, created_at: str) -> bytes:
    """The exact bytes an audit link stores and hashes (RFC 8785)."""
    return jcs(
        {
            "tenant": tenant.public_id,
            "action": entry.action,
            "actor": entry.actor[:200],
            "object_ref": entry.object_ref[:200],
            "payload": entry.payload,
            "created_at": created_at,
        }
    )


def _bounded(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` within MAX_EVENT_PAYLOAD_BYTES: its largest values (an input, an
    output) give way to `{"truncated": true, "size_bytes": n}`, largest first, so that
    what a feed reader needs (tool, status, step, cost, error) stays."""
    size = len(json.dumps(payload, default=str))
    if size <= MAX_EVENT_PAYLOAD_BYTES:
        return payload
    sizes = {key: len(json.dumps(value, default=str)) for key, value in payload.items()}
    bounded = dict(payload)
    marked = "truncated" not in bounded  # a payload's own `truncated` is left as it is
    limit = MAX_EVENT_PAYLOAD_BYTES - (len(', "truncated": true') if marked else 0)
    for key in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if size <= limit or sizes[key] <= 64:
            break
        bounded[key] = {"truncated": True, "size_bytes": sizes[key]}
        size -= sizes[key] - len(json.dumps(bounded[key]))
    if size > limit:  # many small fields: only the marker
        return {"truncated": True, "size_bytes": len(json.dumps(payload, default=str))}
    if marked:
        bounded["truncated"] = True
    return bounded


def _lock_head(tenant: Tenant) -> tuple[int, str, int]:
    """The tenant's chain head (seq, hash, event seq), locked for the rest of the
    transaction (FOR UPDATE on PostgreSQL; SQLite's IMMEDIATE transactions already hold
    the write lock). Plain statements: the ORM's query building cost more than them."""
    tenant_id = TenantLog._meta.pk.get_db_prep_value(tenant.pk, connection)
    table = connection.ops.quote_name(TenantLog._meta.db_table)
    # The table name comes from the model's metadata, quoted; values are parameters.
    select = f"SELECT audit_seq, audit_hash, event_seq FROM {table} WHERE tenant_id = %s"  # noqa: S608
    if connection.features.has_select_for_update:
        select += " FOR UPDATE"
    with connection.cursor() as cursor:
        cursor.execute(select, [tenant_id])
        row = cursor.fetchone()
        if row is None:
            # First write of this tenant: create the head; a racing creator makes ours a
            # no-op.
            _insert([TenantLog(tenant=tenant)], ignore_conflicts=True)
            cursor.execute(select, [tenant_id])
            row = cursor.fetchone()
    return int(row[0]), row[1], int(row[2])


def _move_head(tenant: Tenant, seq: int, hash_: str, event_seq: int) -> None:
    table = connection.ops.quote_name(TenantLog._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET audit_seq = %s, audit_hash = %s, event_seq = %s"  # noqa: S608
            " WHERE tenant_id = %s",
            [seq, hash_, event_seq, TenantLog._meta.pk.get_db_prep_value(tenant.pk, connection)],
        )


def _insert(objs: list[models.Model], *, ignore_conflicts: bool = False) -> None:
    """INSERT `objs` (instances of one model) in one statement per row batch. The ORM's
    save() and bulk_create() spend ~0.4 ms a call on checks and SQL compilation, more
    than SQLite spends on the insert; values go through each field's own
    `get_db_prep_save`, as the ORM would send them, except the common ones whose
    conversion is known (`_fast_conversion`; a test compares the stored rows)."""
    model = type(objs[0])
    # The connection itself, not the `django.db.connection` proxy: each attribute read
    # through the proxy is a context-local lookup, and preparing a row reads ~10.
    conn = connections[DEFAULT_DB_ALIAS]
    auto_id = model._meta.pk.attname if getattr(objs[0], model._meta.pk.attname) is None else ""
    sql, fields = _insert_statement(model, auto_id, ignore_conflicts, conn.vendor)
    params = [_values(obj, fields, conn) for obj in objs]
    with conn.cursor() as cursor:
        if len(params) == 1:
            cursor.execute(sql, params[0])
        else:
            cursor.executemany(sql, params)


_SLOW = object()  # a fast conversion declines: get_db_prep_save decides

_Plan = tuple[tuple[models.Field, frozenset[type], Any], ...]


def _plan(fields: Any, vendor: str) -> _Plan:
    """Each field with its fast conversion (`_fast_conversion`), in the given order."""
    return tuple((f, *_fast_conversion(f, vendor)) for f in fields)


def _values(obj: models.Model, plan: _Plan, conn: Any) -> list[Any]:
    """`obj`'s values for the fields of `plan`, as the database takes them."""
    return [
        _prepared(f, kinds, convert, getattr(obj, f.attname), conn) for f, kinds, convert in plan
    ]


def _prepared(
    field: models.Field, kinds: frozenset[type], convert: Any, value: Any, conn: Any
) -> Any:
    if type(value) in kinds:
        if convert is None or value is None:
            return value
        out = convert(value)
        if out is not _SLOW:
            return out
    return field.get_db_prep_save(value, conn)


# Fields whose get_db_prep_save returns values of these exact types unchanged: a str
# for text, an int for integers, a bool for booleans; and None as None.
_AS_IS: dict[type[models.Field], frozenset[type]] = {
    models.CharField: frozenset({str, type(None)}),
    models.TextField: frozenset({str, type(None)}),
    models.IntegerField: frozenset({int, type(None)}),
    models.BigIntegerField: frozenset({int, type(None)}),
    models.PositiveIntegerField: frozenset({int, type(None)}),
    models.PositiveSmallIntegerField: frozenset({int, type(None)}),
    models.SmallIntegerField: frozenset({int, type(None)}),
    models.BooleanField: frozenset({bool, type(None)}),
}


def _sqlite_datetime(value: datetime) -> Any:
    """What SQLite's adapt_datetimefield_value gives an aware UTC datetime (USE_TZ, the
    connection in UTC): make_naive, then str()."""
    return str(value.replace(tzinfo=None)) if value.tzinfo is UTC else _SLOW


def _fast_conversion(field: models.Field, vendor: str) -> tuple[frozenset[type], Any]:
    """(the value types with a known conversion, the conversion or None for "as is").
    Other values, and other fields, go through get_db_prep_save; None stays None, as
    get_db_prep_save leaves it for every field given types here."""
    as_is = _AS_IS.get(type(field))
    if as_is is not None:
        return as_is, None
    if vendor != "sqlite" or not settings.USE_TZ:
        return frozenset(), None
    if type(field) is models.DateTimeField and connections[DEFAULT_DB_ALIAS].timezone is UTC:
        return frozenset({datetime, type(None)}), _sqlite_datetime
    if type(field) is models.JSONField and field.encoder is None:
        return frozenset({dict, list, type(None)}), json.dumps  # adapt_json_value, no encoder
    if type(field) is models.ForeignKey:
        target = field.target_field
        if type(target) is models.UUIDField:
            return frozenset({uuid.UUID, type(None)}), operator.attrgetter("hex")
        if type(target) is models.CharField:
            return frozenset({str, type(None)}), None
    return frozenset(), None


def _forget_statements(setting: str, **kwargs: Any) -> None:
    """The cached statements read the time zone settings and the database's vendor."""
    if setting in ("USE_TZ", "TIME_ZONE", "DATABASES"):
        _insert_statement.cache_clear()
        _settle_statement.cache_clear()


setting_changed.connect(_forget_statements, dispatch_uid="eai-audit-statements")


@cache
def _insert_statement(
    model: type[models.Model], auto_id: str, ignore_conflicts: bool, vendor: str
) -> tuple[str, _Plan]:
    """The INSERT for `model`'s columns (less an auto-increment id left to the
    database) and, in column order, each field with its fast conversion; built once
    per shape."""
    fields = _plan((f for f in model._meta.concrete_fields if f.attname != auto_id), vendor)
    quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
    columns = ", ".join(quote(f.column) for f, _kinds, _convert in fields)
    marks = ", ".join(["%s"] * len(fields))
    verb, suffix = "INSERT", ""
    if ignore_conflicts:
        if vendor == "sqlite":
            verb = "INSERT OR IGNORE"
        else:
            suffix = " ON CONFLICT DO NOTHING"
    return f"{verb} INTO {quote(model._meta.db_table)} ({columns}) VALUES ({marks}){suffix}", fields


def record(
    tenant: Tenant,
    entries: list[Entry] | tuple[Entry, ...] = (),
    events: list[AgentEvent] | tuple[AgentEvent, ...] = (),
) -> None:
    """Append `entries` to the tenant's chain and `events` to its feed.

    Must run inside the transaction of the change being recorded (a `tenant_scope`).
    """
    if not entries and not events:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("audit.record() must run inside the change's transaction")
    seq, prev, sequence = _lock_head(tenant)
    now = timezone.now()
    stamp = now.isoformat()
    links = []
    for entry in entries:
        seq += 1
        canonical = canonical_body(tenant, entry, stamp)
        digest = link_hash(prev, seq, canonical)
        links.append(
            AuditEvent(
                tenant=tenant,
                seq=seq,
                action=entry.action,
                actor=entry.actor[:200],
                object_ref=entry.object_ref[:200],
                canonical=canonical.decode(),
                prev_hash=prev,
                hash=digest,
                created_at=now,
            )
        )
        prev = digest
    rows = []
    for event in events:
        sequence += 1
        rows.append(
            Event(
                id=new_id("evt"),
                tenant=tenant,
                sequence=sequence,
                type=event.type,
                run_id=event.run_id,
                invocation_id=event.invocation_id,
                refs=event.refs,
                payload=_bounded(event.payload),
                created_at=now,
            )
        )
    if links:
        _insert(links)
    if rows:
        _insert(rows)
    _move_head(tenant, seq, prev, sequence)


def _column_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (bytes, memoryview)):
        return "\\x" + bytes(value).hex()  # bytea's hex input form
    return value


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[str, str, bool], ...]:
    return tuple((f.attname, f.column, f.primary_key) for f in model._meta.concrete_fields)


# Values JSON carries as they are: most of a row's, so they skip _column_value.
_JSON_AS_IS = frozenset({str, int, bool, float, dict, list})


def row_of(obj: models.Model) -> dict[str, Any]:
    """A model instance as `{column: JSON value}` for jsonb_populate_recordset."""
    row = {}
    # A field's value sits in the instance's __dict__ under its attname (deferred fields
    # excepted: getattr loads those); reading it there skips the descriptor protocol.
    values = obj.__dict__
    for attname, column, primary_key in _columns(type(obj)):
        value = values[attname] if attname in values else getattr(obj, attname)
        if type(value) in _JSON_AS_IS:
            row[column] = value
        elif value is None:
            if not primary_key:  # an auto-increment id: the database assigns it
                row[column] = None
        else:
            row[column] = _column_value(value)
    return row


def record_with_rows(
    tenant: Tenant,
    rows: list[tuple[models.Model, bool]],
    entries: list[Entry],
    events: list[AgentEvent],
) -> None:
    """Insert `rows` (instance, ignore_conflicts) and record `entries` and `events`, in
    one round trip on PostgreSQL (`eai_record_call`); elsewhere through the ORM, in one
    transaction. Either way the chain and the feed come out the same."""
    if connection.vendor != "postgresql":
        with tenant_scope(tenant):
            _insert_and_record(tenant, rows, entries, events)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT eai_record_call(%s::uuid, %s::jsonb)",
            [str(tenant.pk), transport_json(_call_doc(tenant, rows, entries, events))],
        )


def _insert_and_record(
    tenant: Tenant,
    rows: list[tuple[models.Model, bool]],
    entries: list[Entry],
    events: list[AgentEvent],
) -> None:
    """The write of `eai_record_call`, statement by statement (databases other than
    PostgreSQL), inside the caller's tenant_scope."""
    for obj, ignore_conflicts in rows:
        _insert([obj], ignore_conflicts=ignore_conflicts)
    finops.add_spend(tenant, finops.spend_increments(obj for obj, _ in rows))
    record(tenant, entries, events)


# What settling a call writes on its invocation row; `eai_settle_call` (migration
# 0009) sets the same columns. The raw input is destroyed once the call ends.
SETTLE_FIELDS = (
    "status",
    "sealed_input",
    "output",
    "error",
    "redactions",
    "cost_amount",
    "cost_currency",
    "finished_at",
)


def _settle_update(tenant: Tenant, invocation: models.Model) -> bool:
    """UPDATE the invocation's SETTLE_FIELDS if it is still `running`; whether it was.
    What the ORM's filter().update() sends, values prepared as `_insert` prepares them,
    without compiling a query each call."""
    conn = connections[DEFAULT_DB_ALIAS]
    sql, fields, tenant_field = _settle_statement(type(invocation), conn.vendor)
    params = _values(invocation, fields, conn)
    params += [invocation.pk, tenant_field.get_db_prep_save(tenant.pk, conn)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1


@cache
def _settle_statement(model: type[models.Model], vendor: str) -> tuple[str, _Plan, models.Field]:
    quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
    fields = _plan(map(model._meta.get_field, SETTLE_FIELDS), vendor)
    assignments = ", ".join(f"{quote(f.column)} = %s" for f, _kinds, _convert in fields)
    tenant_field = model._meta.get_field("tenant")
    status = model._meta.get_field("status").column
    # Every name below comes from the model's metadata, none from input.
    sql = (
        f"UPDATE {quote(model._meta.db_table)} SET {assignments} "  # noqa: S608
        f"WHERE {quote(model._meta.pk.column)} = %s AND {quote(tenant_field.column)} = %s "
        f"AND {quote(status)} = 'running'"
    )
    return sql, fields, tenant_field


def settle_with_rows(
    tenant: Tenant,
    invocation: models.Model,
    rows: list[tuple[models.Model, bool]],
    entries: list[Entry],
    events: list[AgentEvent],
) -> bool:
    """Move a `running` invocation to its final SETTLE_FIELDS, then insert `rows` and record
    `entries` and `events`, only if it was still running (False otherwise: another
    process settled it; nothing is written). One round trip on PostgreSQL
    (`eai_settle_call`); elsewhere a conditional update and `record`, in one
    transaction."""
    if connection.vendor != "postgresql":
        with tenant_scope(tenant):
            if not _settle_update(tenant, invocation):
                return False
            _insert_and_record(tenant, rows, entries, events)
        return True
    doc = _call_doc(tenant, rows, entries, events)
    # Plain columns all: each field's name is its column's.
    settle = {name: _column_value(getattr(invocation, name)) for name in SETTLE_FIELDS}
    doc["settle"] = {"id": invocation.pk, **settle}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT eai_settle_call(%s::uuid, %s::jsonb)",
            [str(tenant.pk), transport_json(doc)],
        )
        return bool(cursor.fetchone()[0])


def _call_doc(
    tenant: Tenant,
    rows: list[tuple[models.Model, bool]],
    entries: list[Entry],
    events: list[AgentEvent],
) -> dict[str, Any]:
    """The document `eai_record_call` reads: rows to insert, audit links to chain (their
    canonical bodies), feed events to number."""
    stamp = timezone.now().isoformat()
    inserts: list[dict[str, Any]] = []
    for obj, ignore_conflicts in rows:
        table = obj._meta.db_table
        if inserts and inserts[-1]["table"] == table and not ignore_conflicts:
            inserts[-1]["rows"].append(row_of(obj))
        else:
            inserts.append(
                {"table": table, "rows": [row_of(obj)], "ignore_conflicts": ignore_conflicts}
            )
    return {
        "inserts": inserts,
        "audit": [
            {
                "action": e.action,
                "actor": e.actor[:200],
                "object_ref": e.object_ref[:200],
                "canonical": canonical_body(tenant, e, stamp).decode(),
                "created_at": stamp,
            }
            for e in entries
        ],
        "events": [
            {
                "id": new_id("evt"),
                "type": e.type,
                "run_id": e.run_id,
                "invocation_id": e.invocation_id,
                "refs": e.refs,
                "payload": _bounded(e.payload),
                "created_at": stamp,
            }
            for e in events
        ],
    }


# ------------------------------------------------------------------ verification


def verify_chain(tenant: Tenant, *, anchors: Path | str | None = None) -> dict[str, Any]:
    """`{"valid", "length", "head_hash", "first_invalid_seq", "proven_through_seq",
    "last_full_verification_at"}` for the tenant's chain.

    Each link is recomputed from its stored canonical bytes from the genesis; its
    columns must match those bytes; the chain must match the head row, every
    checkpoint row and every checkpoint of the anchor log (`anchors`, by default
    EAI_AUDIT_ANCHOR_PATH), each signed by a trusted key (`trusted_keys`). The anchor
    log lives outside the database: a chain truncated or rewritten behind deleted,
    rolled-back or forged checkpoint rows still disagrees with it. `proven_through_seq`
    is the last entry a trusted checkpoint covers (0: none); entries after it are
    covered by the next checkpoint. Every verification is full: a bounded one (from
    the last full one, whose time `last_full_verification_at` would then give) is a
    later step.
    """
    started = timezone.now()
    try:
        anchored = read_anchors(tenant, anchors)
    except AnchorLogDamaged:
        anchored = None  # a line of the tenant's is damaged: its log proves nothing
    expected_seq, prev = 1, GENESIS
    first_invalid = None
    rows = (
        AuditEvent.objects.for_tenant(tenant)
        .order_by("seq")
        .values_list("seq", "action", "actor", "object_ref", "canonical", "prev_hash", "hash")
    )
    hashes: dict[int, str] = {}
    length = 0
    for seq, action, actor, object_ref, canonical, prev_hash, digest in rows.iterator(2000):
        length += 1
        if first_invalid is None and not _link_ok(
            expected_seq, prev, seq, action, actor, object_ref, canonical, prev_hash, digest
        ):
            first_invalid = min(seq, expected_seq)
        hashes[seq] = digest
        prev = digest
        expected_seq = seq + 1
    head_hash = prev if length else GENESIS
    head = TenantLog.objects.for_tenant(tenant).first()
    if (
        first_invalid is None
        and head is not None
        and (head.audit_seq != length or head.audit_hash != head_hash)
    ):
        first_invalid = min(head.audit_seq, length) + 1
    checkpoints = {
        Checkpoint(c.seq, c.head_hash, c.key_id, c.signature)
        for c in AuditCheckpoint.objects.for_tenant(tenant)
    }
    if anchored is None:
        first_invalid = 1
        anchored = []
    proven = []
    for checkpoint in checkpoints.union(anchored):
        if checkpoint.signature_ok(tenant) and hashes.get(checkpoint.seq) == checkpoint.head_hash:
            proven.append(checkpoint.seq)
            continue
        # Forged, unknown key, or the chain no longer holds what was signed: entries
        # from there on (or from the first missing one) are not the signed ones.
        bad = max(1, min(checkpoint.seq, length + 1))
        first_invalid = bad if first_invalid is None else min(first_invalid, bad)
    below = [seq for seq in proven if first_invalid is None or seq < first_invalid]
    return {
        "valid": first_invalid is None,
        "length": length,
        "head_hash": head_hash,
        "first_invalid_seq": first_invalid,
        "proven_through_seq": max(below, default=0),
        "last_full_verification_at": started.isoformat(),
    }


def _link_ok(
    expected_seq: int,
    expected_prev: str,
    seq: int,
    action: str,
    actor: str,
    object_ref: str,
    canonical: str,
    prev_hash: str,
    digest: str,
) -> bool:
    if seq != expected_seq or prev_hash != expected_prev:
        return False
    raw = canonical.encode()
    if link_hash(prev_hash, seq, raw) != digest:
        return False
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    return (
        isinstance(body, dict)
        and body.get("action") == action
        and body.get("actor") == actor
        and body.get("object_ref") == object_ref
    )


def event_view(event: AuditEvent) -> dict[str, Any]:
    """An audit event as the API shows it (fields read from the hashed bytes)."""
    body = json.loads(event.canonical)
    return {
        "seq": event.seq,
        "action": event.action,
        "actor": event.actor,
        "object_ref": event.object_ref,
        "created_at": body.get("created_at"),
        "payload": body.get("payload", {}),
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


# ------------------------------------------------------------------ checkpoints


@cache
def signing_key() -> Ed25519PrivateKey:
    """EAI_AUDIT_SIGNING_KEY (base64 of 32 raw bytes), else a key generated once into
    the git-ignored `.eai-audit-key` that every process of the checkout reads."""
    raw = settings.EAI_AUDIT_SIGNING_KEY
    if not raw:
        raw = read_or_create(
            settings.BASE_DIR / ".eai-audit-key", lambda: base64.b64encode(os.urandom(32)).decode()
        )
    return Ed25519PrivateKey.from_private_bytes(base64.b64decode(raw))


def _raw_b64(public: Ed25519PublicKey) -> str:
    return base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def _key_id_of(public_b64: str) -> str:
    return hashlib.sha256(public_b64.encode()).hexdigest()[:16]


def public_key_b64() -> str:
    return _raw_b64(signing_key().public_key())


def key_id() -> str:
    return _key_id_of(public_key_b64())


@cache
def trusted_keys() -> dict[str, Ed25519PublicKey]:
    """Key id → public key of every key whose checkpoints count: the current signing
    key and the retired ones listed in EAI_AUDIT_RETIRED_KEYS. Nothing else: a key id
    costs a forger nothing to choose, so an unknown one proves nothing."""
    keys = {key_id(): signing_key().public_key()}
    for raw in settings.EAI_AUDIT_RETIRED_KEYS:
        try:
            public = Ed25519PublicKey.from_public_bytes(base64.b64decode(raw, validate=True))
        except ValueError as exc:  # binascii.Error is one
            raise ImproperlyConfigured(
                "EAI_AUDIT_RETIRED_KEYS: each entry is the base64 of a 32-byte Ed25519 "
                f"public key; {raw[:12]!r}… is not"
            ) from exc
        keys[_key_id_of(_raw_b64(public))] = public
    return keys


def check_audit_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """System check: every retired key listed is a public key (else verification would
    fail at its first use)."""
    try:
        trusted_keys()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="eai.E020")]
    finally:
        trusted_keys.cache_clear()  # read again at first use, with the settings then
    return []


def _forget_keys(setting: str, **kwargs: Any) -> None:
    if setting in ("EAI_AUDIT_SIGNING_KEY", "EAI_AUDIT_RETIRED_KEYS", "BASE_DIR"):
        signing_key.cache_clear()
        trusted_keys.cache_clear()


setting_changed.connect(_forget_keys, dispatch_uid="eai-audit-keys")


def _checkpoint_message(tenant_public_id: str, seq: int, head_hash: str) -> bytes:
    return rfc8785.dumps({"tenant": tenant_public_id, "seq": seq, "head_hash": head_hash})


@dataclass(frozen=True)
class Checkpoint:
    """A signed copy of a chain head, from the database or from the anchor log."""

    seq: int
    head_hash: str
    key_id: str
    signature: str

    def signature_ok(self, tenant: Tenant) -> bool:
        """Signed by a trusted key over (tenant, seq, head_hash)."""
        public = trusted_keys().get(self.key_id)
        if public is None:
            return False
        try:
            public.verify(
                base64.b64decode(self.signature, validate=True),
                _checkpoint_message(tenant.public_id, self.seq, self.head_hash),
            )
        except (InvalidSignature, ValueError):
            return False
        return True


def write_checkpoint(tenant: Tenant) -> AuditCheckpoint | None:
    """Sign the tenant's current head, unless it is already checkpointed, and append
    the checkpoint to the anchor log.

    Runs inside a tenant scope; the head is read under its lock so it is a real head.
    The anchor line is written (and synced) before the row commits: a failed append
    leaves no checkpoint the log lacks; a failed commit leaves a line that still holds
    (the head it signs was committed before).
    """
    head = TenantLog.objects.select_for_update().filter(tenant=tenant).first()
    if head is None or head.audit_seq == 0:
        return None
    if AuditCheckpoint.objects.filter(tenant=tenant, seq=head.audit_seq).exists():
        return None
    message = _checkpoint_message(tenant.public_id, head.audit_seq, head.audit_hash)
    checkpoint = AuditCheckpoint.objects.create(
        tenant=tenant,
        seq=head.audit_seq,
        head_hash=head.audit_hash,
        signature=base64.b64encode(signing_key().sign(message)).decode(),
        key_id=key_id(),
    )
    append_anchor(checkpoint_line(tenant, checkpoint))
    return checkpoint


def checkpoint_line(tenant: Tenant, checkpoint: AuditCheckpoint) -> dict[str, Any]:
    """A checkpoint as the anchor log and `audit_checkpoints --export` write it: one
    JSON object a line, with its public key for an auditor (verification itself trusts
    only the keys configured here, never one a line carries)."""
    public = trusted_keys().get(checkpoint.key_id)
    return {
        "tenant": tenant.public_id,
        "seq": checkpoint.seq,
        "head_hash": checkpoint.head_hash,
        "signature": checkpoint.signature,
        "key_id": checkpoint.key_id,
        "public_key": None if public is None else _raw_b64(public),
        "created_at": checkpoint.created_at.isoformat(),
    }


def export_checkpoints(tenant: Tenant) -> list[dict[str, Any]]:
    """The tenant's checkpoints with their public keys, for keeping outside the database."""
    return [
        checkpoint_line(tenant, c)
        for c in AuditCheckpoint.objects.for_tenant(tenant).order_by("seq")
    ]


def coverage_note() -> str:
    """What verification shows beside its verdict: what the checkpoints do not cover yet."""
    from django.utils.translation import gettext  # noqa: PLC0415

    minutes = float(settings.CELERY_BEAT_SCHEDULE["audit-checkpoints"]["schedule"]) / 60
    return gettext(
        "Entries after proven_through_seq are covered by the next signed checkpoint "
        "(every %(minutes)s minutes); until then only the database holds them."
    ) % {"minutes": f"{minutes:g}"}


# ------------------------------------------------------------------ the anchor log


class AnchorLogDamaged(Exception):
    """A line of the anchor log is not a checkpoint: the log was edited or damaged."""


def anchor_path() -> Path:
    return Path(settings.EAI_AUDIT_ANCHOR_PATH)


def append_anchor(line: dict[str, Any]) -> None:
    """Append one checkpoint line to the anchor log, durably: an exclusive lock (other
    processes append to the same file), a single write at the end, fsync (and of the
    directory when the file is new). A line left incomplete by a crash is cut first, so
    the new line does not glue onto it."""
    path = anchor_path()
    data = (json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n").encode()
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _cut_torn_tail(fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock
    if created:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _cut_torn_tail(fd: int) -> None:
    """Truncate an unterminated last line (an append a crash interrupted: it was
    never whole, so it never proved anything)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    end = size
    while end > 0:
        start = max(0, end - 4096)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            os.ftruncate(fd, start + newline + 1)
            return
        end = start
    os.ftruncate(fd, 0)


_ANCHOR_FIELDS = {"seq": int, "head_hash": str, "key_id": str, "signature": str}


def read_anchors(tenant: Tenant, path: Path | str | None = None) -> list[Checkpoint]:
    """The tenant's checkpoints in the anchor log (`path`, by default
    EAI_AUDIT_ANCHOR_PATH; a missing default log holds none, a missing given file
    raises FileNotFoundError). A line naming the tenant that is not a checkpoint raises
    AnchorLogDamaged; an unterminated last line is an append still under way, or cut by
    a crash, and is skipped. The log is read line by line (it holds every tenant's
    checkpoints), and only lines naming the tenant are parsed."""
    target = anchor_path() if path is None else Path(path)
    try:
        handle = open(target, "rb")  # noqa: SIM115 - closed below, after the shared lock
    except FileNotFoundError:
        if path is None:
            return []
        raise
    mine = tenant.public_id.encode()
    found = []
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)  # no append is half-written under it
        for number, raw in enumerate(handle, start=1):
            if mine not in raw or not raw.endswith(b"\n"):
                continue
            checkpoint = _anchor_line(raw, tenant.public_id)
            if checkpoint is None:
                raise AnchorLogDamaged(f"{target}: line {number} is not a checkpoint")
            found.append(checkpoint)
    return found


def _anchor_line(raw: bytes, tenant_public_id: str) -> Checkpoint | None:
    """The checkpoint a line of the tenant holds, or None if it is not one."""
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(line, dict) or line.get("tenant") != tenant_public_id:
        return None
    for name, kind in _ANCHOR_FIELDS.items():
        if type(line.get(name)) is not kind:
            return None
    return Checkpoint(line["seq"], line["head_hash"], line["key_id"], line["signature"])
