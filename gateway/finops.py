"""Usage metering, budgets and delivery to a FinOps service.

Every finished call that cost something writes a `tool_call` usage event in the same
transaction as its result; clients may report their own usage through the API. Usage
rows not yet delivered are the outbox that `deliver_outbox()` (a Celery beat job, or
the embedded schedule) posts to EAI_FINOPS_URL, marking each delivered once.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import cache
from typing import Any

import urllib3
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.db.models.signals import post_save
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from eai.process_cache import ProcessCache
from gateway.models import (
    RUN_ID_RE,
    BudgetHold,
    Invocation,
    MonthlySpend,
    UsageEvent,
    built,
    format_amount,
    new_id,
)
from tenants.models import Tenant
from tenants.scope import tenant_scope

logger = logging.getLogger(__name__)

GROUPS = {"tool": "tool", "agent": "agent", "run": "run_id"}
EVENT_FIELDS = {"unit", "quantity", "amount", "currency", "tool", "agent", "run_id", "occurred_at"}
_POOL = urllib3.PoolManager(maxsize=4, retries=False)


class UsageInvalid(Exception):
    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} invalid usage event(s)")


def usage_for(invocation: Invocation) -> UsageEvent | None:
    """The `tool_call` usage event of a finished call (None when it cost nothing)."""
    if invocation.cost_amount is None:
        return None
    return built(
        UsageEvent,
        id=new_id("use"),
        tenant_id=invocation.tenant_id,
        unit="tool_call",
        quantity=Decimal(1),
        amount=invocation.cost_amount,
        currency=invocation.cost_currency or "EUR",
        tool=invocation.tool,
        agent=invocation.agent,
        run_id=invocation.run_id,
        invocation_id=invocation.id,
        occurred_at=invocation.finished_at or timezone.now(),
    )


_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9998, 12, 31, tzinfo=UTC)


def parse_moment(raw: Any, *, dates: bool = False, clamp: bool = False) -> datetime | None:
    """An ISO 8601 time (with `dates`, a bare date too) as an aware datetime, or None:
    not a string, not such a time, no such day, or out of 1970-9998 once in UTC (year 1
    or 9999 with an offset overflowed when stored or compared: a 500). With `clamp` (a
    query's bounds), a time out of that range is its nearest end instead."""
    if not isinstance(raw, str):
        return None
    try:
        parsed = parse_datetime(raw)
        if parsed is None and dates:
            parsed = datetime.combine(date.fromisoformat(raw), time.min)
        if parsed is None:
            return None
        if not timezone.is_aware(parsed):
            parsed = timezone.make_aware(parsed)
        in_utc = parsed.astimezone(UTC)
    except OverflowError:  # year 1 less an hour, year 9999 plus one
        if not clamp:
            return None
        return _EARLIEST if parsed.year < 1970 else _LATEST
    except ValueError:  # "2026-02-30", "25:00", "+99:00"
        return None
    if 1970 <= in_utc.year <= 9998:
        return parsed
    if not clamp:
        return None
    return _EARLIEST if in_utc.year < 1970 else _LATEST


def month_of(moment: datetime) -> date:
    """The first day of `moment`'s month, in TIME_ZONE: the budget's months."""
    return timezone.localtime(moment).date().replace(day=1)


def spend_increments(rows: Any) -> list[tuple[date, str, Decimal]]:
    """What the usage events among `rows` add to MonthlySpend: their non-zero amounts
    summed per month and currency."""
    totals: dict[tuple[date, str], Decimal] = {}
    for row in rows:
        if isinstance(row, UsageEvent) and row.amount:
            key = (month_of(row.occurred_at), row.currency)
            amount = Decimal(row.amount).quantize(MICRO, rounding=ROUND_HALF_UP)
            totals[key] = totals.get(key, Decimal(0)) + amount
    return [(month, currency, amount) for (month, currency), amount in sorted(totals.items())]


def add_spend(tenant: Tenant, increments: list[tuple[date, str, Decimal]]) -> None:
    """Add `increments` to the tenant's MonthlySpend rows, inside the caller's tenant
    scope and transaction. On PostgreSQL a trigger on the usage table does it for every
    row written, whoever writes it (migration 0010): nothing to do here."""
    if not increments or connection.vendor == "postgresql":
        return
    sql, fields = _spend_statement(connection.vendor)
    with connection.cursor() as cursor:
        for month, currency, total in increments:
            values = zip(fields, (tenant.pk, month, currency, total), strict=True)
            cursor.execute(sql, [f.get_db_prep_save(v, connection) for f, v in values])


@cache
def _spend_statement(vendor: str) -> tuple[str, list[Any]]:
    """The upsert `add_spend` sends and its fields in parameter order; built once."""
    meta = MonthlySpend._meta
    fields = [meta.get_field(name) for name in ("tenant", "month", "currency", "amount")]
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    keys = ", ".join(quote(f.column) for f in fields[:3])
    amount = quote(fields[3].column)
    # Every name comes from the model's metadata, none from input.
    sql = (
        f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s) "  # noqa: S608
        f"ON CONFLICT ({keys}) DO UPDATE SET {amount} = {table}.{amount} + excluded.{amount}"
    )
    return sql, fields


def spent_this_month(tenant: Tenant) -> Decimal:
    """The tenant's spending in its budget currency since this month began (usage
    reported for later months included), read from MonthlySpend: a few rows, whatever
    the number of calls."""
    with tenant_scope(tenant, readonly=True):
        total = (
            MonthlySpend.objects.for_tenant(tenant)
            .filter(month__gte=month_of(timezone.now()), currency=tenant.budget_currency)
            .aggregate(total=Sum("amount"))["total"]
        )
    return total or Decimal(0)


# Each tenant's (monthly_budget, budget_currency) as last read, per process: whether a
# call must reserve at all is decided from it, so a tenant without a budget pays no
# round trip. A budget set or removed (`set_budget`, the admin) reaches every process
# within BUDGET_CACHE_S; the reservation itself reads the tenant's row, never this.
BUDGET_CACHE_S = 1.0
_budgets: ProcessCache[tuple[Decimal | None, str]] = ProcessCache(
    BUDGET_CACHE_S, keep=lambda found: True
)


def budget_of(tenant: Tenant) -> tuple[Decimal | None, str]:
    """The tenant's (monthly budget or None, its currency), at most BUDGET_CACHE_S old."""
    return _budgets.get(tenant.pk, lambda _key: _read_budget(tenant))


def _read_budget(tenant: Tenant) -> tuple[Decimal | None, str]:
    row = Tenant.objects.filter(pk=tenant.pk).values_list("monthly_budget", "budget_currency")
    found = row.first()
    return found if found is not None else (None, tenant.budget_currency)


def forget_budgets(**kwargs: Any) -> None:
    """Forget every tenant's budget read by this process (a tenant changed here)."""
    _budgets.clear()


# A budget changed in the admin applies in this process at once, elsewhere within 1 s.
post_save.connect(forget_budgets, sender=Tenant, dispatch_uid="eai-forget-budgets")


def over_budget(tenant: Tenant, cost: Decimal) -> bool:
    """Whether a call costing `cost` would take the tenant past its monthly budget
    now (a reading, no reservation: for calls parked for approval, which reserve when
    they run)."""
    budget, currency = budget_of(tenant)
    if budget is None:
        return False
    with tenant_scope(tenant, readonly=True):
        used = (
            MonthlySpend.objects.for_tenant(tenant)
            .filter(month__gte=month_of(timezone.now()), currency=currency)
            .aggregate(total=Sum("amount") + Sum("reserved"))["total"]
        )
    return (used or Decimal(0)) + cost > budget


class BudgetExceeded(Exception):
    """The call's cost does not fit in what is left of the tenant's monthly budget."""

    def __init__(self, budget: Decimal, currency: str) -> None:
        self.budget = budget
        self.currency = currency
        super().__init__(f"monthly budget {budget} {currency} exceeded")


def reserve(tenant: Tenant, invocation_id: str, cost: Decimal) -> None:
    """Hold `cost` of the tenant's monthly budget for the call `invocation_id` before it
    runs, or raise BudgetExceeded. Nothing is held without a budget; a call holding
    already (an async call admitted earlier, run now) holds nothing more. The hold is
    released when the call's invocation reaches a final status (a trigger), by
    `release`, or by the recovery sweep (`release_stale_holds`).

    Reading the spend before a call and writing it after let 20 calls at once, with
    two calls' worth left, spend 17 (every one read the same remainder): the hold is
    taken under the month row's lock. One round trip on PostgreSQL
    (`eai_reserve_budget`); on SQLite the write lock serializes it."""
    if budget_of(tenant)[0] is None:
        return
    month = month_of(timezone.now())
    cost = Decimal(cost).quantize(MICRO, rounding=ROUND_HALF_UP)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT eai_reserve_budget(%s::uuid, %s, %s::date, %s::numeric)",
                [str(tenant.pk), invocation_id, month, cost],
            )
            found = cursor.fetchone()[0]
        if isinstance(found, str):
            found = json.loads(found)
        if not found["ok"]:
            raise BudgetExceeded(Decimal(found["budget"]), found["currency"])
        return
    with tenant_scope(tenant):
        _reserve_here(tenant, invocation_id, month, cost)


def _reserve_here(tenant: Tenant, invocation_id: str, month: date, cost: Decimal) -> None:
    """`eai_reserve_budget` statement by statement, inside the caller's transaction
    (SQLite's IMMEDIATE transaction holds the write lock: nobody moves the totals
    between the reading and the writing). Plain statements, built once: through the ORM
    the reservation cost three times the CPU. Amounts are summed as decimals here, not
    in SQLite's floating point (0.1 + 0.1 + 0.1 is not 0.3 there)."""
    sql = _reserve_statements()
    tenant_id = Tenant._meta.pk.get_db_prep_value(tenant.pk, connection)
    month_value = connection.ops.adapt_datefield_value(month)
    with connection.cursor() as cursor:
        cursor.execute(sql["budget"], [tenant_id])
        found = cursor.fetchone()
        if found is None or found[0] is None:
            return
        budget, currency = _exact(found[0]), found[1]
        cursor.execute(sql["held"], [invocation_id])
        if cursor.fetchone() is not None:
            return
        cursor.execute(sql["spend"], [tenant_id, month_value, currency])
        used, reserved = Decimal(0), Decimal(0)
        for row_month, amount, row_reserved in cursor.fetchall():
            used += _exact(amount) + _exact(row_reserved)
            if str(row_month) == month_value:
                reserved = _exact(row_reserved)
        if used + cost > budget:
            raise BudgetExceeded(budget, currency)
        if cost <= 0:
            return
        cursor.execute(sql["reserve"], [tenant_id, month_value, currency, str(reserved + cost)])
        cursor.execute(
            sql["hold"],
            [
                invocation_id,
                tenant_id,
                month_value,
                currency,
                str(cost),
                connection.ops.adapt_datetimefield_value(timezone.now()),
            ],
        )


def _exact(value: Any) -> Decimal:
    """A decimal column's value as SQLite returns it (int, float or str), to 6 places."""
    return Decimal(str(value)).quantize(MICRO, rounding=ROUND_HALF_UP)


@cache
def _reserve_statements() -> dict[str, str]:
    """The statements of `_reserve_here`; every name from the models' metadata."""
    quote = connection.ops.quote_name
    tenant = Tenant._meta
    spend = quote(MonthlySpend._meta.db_table)
    hold = quote(BudgetHold._meta.db_table)
    tenants = quote(tenant.db_table)
    tenant_pk = quote(tenant.pk.column)
    upsert = "ON CONFLICT (tenant_id, month, currency) DO UPDATE SET reserved = excluded.reserved"
    hold_columns = "invocation_id, tenant_id, month, currency, amount, created_at"
    # Names from the models' metadata, quoted; every value is a parameter.
    return {
        "budget": f"SELECT monthly_budget, budget_currency FROM {tenants} WHERE {tenant_pk} = %s",  # noqa: S608
        "held": f"SELECT 1 FROM {hold} WHERE invocation_id = %s",  # noqa: S608
        "spend": f"SELECT month, amount, reserved FROM {spend} WHERE tenant_id = %s AND month >= %s AND currency = %s",  # noqa: S608, E501
        "reserve": f"INSERT INTO {spend} (tenant_id, month, currency, amount, reserved) VALUES (%s, %s, %s, 0, %s) {upsert}",  # noqa: S608, E501
        "hold": f"INSERT INTO {hold} ({hold_columns}) VALUES (%s, %s, %s, %s, %s, %s)",  # noqa: S608
    }


def release(tenant: Tenant, invocation_id: str) -> bool:
    """Give back the hold of `invocation_id` (if any) to the tenant's budget; whether one
    was held. For a call that ended without writing a final status (its write failed,
    a dead process): a final status releases on its own."""
    with tenant_scope(tenant):
        hold = (
            BudgetHold.objects.for_tenant(tenant)
            .select_for_update()
            .filter(invocation_id=invocation_id)
            .first()
        )
        if hold is None:
            return False
        spend = MonthlySpend.objects.for_tenant(tenant).filter(
            month=hold.month, currency=hold.currency
        )
        row = spend.select_for_update().first()
        if row is not None:
            spend.update(reserved=max(row.reserved - hold.amount, Decimal(0)))
        BudgetHold.objects.for_tenant(tenant).filter(invocation_id=invocation_id).delete()
    return True


def release_stale_holds(tenant: Tenant, *, horizon: timedelta) -> int:
    """Release the holds no call will release (the recovery sweep): those of a call
    that ended without releasing, and those older than `horizon` of a call with no
    row (a process died during an idempotent call, whose row is written after it).
    Holds of calls still queued, running or waiting stay."""
    now = timezone.now()
    with tenant_scope(tenant, readonly=True):
        holds = list(
            BudgetHold.objects.for_tenant(tenant).values_list("invocation_id", "created_at")[:1000]
        )
        statuses = dict(
            Invocation.objects.for_tenant(tenant)
            .filter(pk__in=[h[0] for h in holds])
            .values_list("id", "status")
        )
    released = 0
    for invocation_id, created_at in holds:
        status = statuses.get(invocation_id)
        ended = status is not None and status not in Invocation.PENDING
        lost = status is None and created_at < now - horizon
        if (ended or lost) and release(tenant, invocation_id):
            released += 1
    return released


def _decimal(value: Any, field: str, errors: list[dict[str, str]], index: int) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        errors.append({"path": f"/events/{index}/{field}", "message": "must be a decimal string"})
        return Decimal(0)
    # Strings as amounts are written (no "1e3"); a JSON number as Python read it (0.00002
    # prints as 2e-05, and is a fine per-token price).
    if isinstance(value, str) and not _DECIMAL_RE.match(value):
        errors.append({"path": f"/events/{index}/{field}", "message": "must be a decimal string"})
        return Decimal(0)
    try:
        number = Decimal(repr(value) if isinstance(value, float) else str(value))
    except InvalidOperation:
        errors.append({"path": f"/events/{index}/{field}", "message": "must be a decimal string"})
        return Decimal(0)
    if not number.is_finite() or number < 0 or number >= Decimal("1e12"):
        errors.append({"path": f"/events/{index}/{field}", "message": "out of range"})
        return Decimal(0)
    # Stored with 6 decimals: round here, as PostgreSQL's numeric would (SQLite would
    # not), so the events, their aggregates and the budget's running total agree.
    return number.quantize(MICRO, rounding=ROUND_HALF_UP)


MICRO = Decimal("0.000001")
_DECIMAL_RE = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,20})?\Z")  # as amounts are written: no 1e3
FUTURE_SKEW = timedelta(minutes=5)


def parse_events(body: Any, *, agent: str) -> list[UsageEvent]:
    """Validate `{"events": [...]}` or one event; every error at its JSON pointer."""
    if isinstance(body, list):  # a bare array of events reads as {"events": [...]}
        body = {"events": body}
    events = body.get("events") if isinstance(body, dict) and "events" in body else [body]
    if not isinstance(events, list) or not events or len(events) > 1000:
        raise UsageInvalid([{"path": "/events", "message": "1 to 1000 events"}])
    now = timezone.now()
    errors: list[dict[str, str]] = []
    rows = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            errors.append({"path": f"/events/{index}", "message": "must be an object"})
            continue
        for unknown in sorted(set(event) - EVENT_FIELDS):
            errors.append({"path": f"/events/{index}/{unknown}", "message": "unknown field"})
        unit = event.get("unit")
        if not isinstance(unit, str) or not 0 < len(unit) <= 50:
            errors.append({"path": f"/events/{index}/unit", "message": "required string"})
        currency = event.get("currency", "EUR")
        if not isinstance(currency, str) or len(currency) != 3 or not currency.isupper():
            errors.append({"path": f"/events/{index}/currency", "message": "ISO 4217 code"})
        for field in ("tool", "agent", "run_id"):
            if field in event and not isinstance(event[field], str):
                errors.append({"path": f"/events/{index}/{field}", "message": "must be a string"})
            elif field in event and len(event[field]) > 200:
                errors.append({"path": f"/events/{index}/{field}", "message": "at most 200"})
        run_id = event.get("run_id")
        if isinstance(run_id, str) and run_id and not RUN_ID_RE.match(run_id):
            errors.append({"path": f"/events/{index}/run_id", "message": "not a run id"})
        occurred = now
        if "occurred_at" in event:
            parsed = parse_moment(event["occurred_at"])
            if parsed is None:
                errors.append(
                    {"path": f"/events/{index}/occurred_at", "message": "ISO 8601 time, 1970-9998"}
                )
            else:
                occurred = parsed
                # Usage that has not happened yet would count against the budget now
                # (its month is counted from this one on): a clock's skew at most.
                if occurred > now + FUTURE_SKEW:
                    errors.append(
                        {"path": f"/events/{index}/occurred_at", "message": "in the future"}
                    )
        rows.append(
            UsageEvent(
                id=new_id("use"),
                source="api",
                unit=str(unit)[:50],
                quantity=_decimal(event.get("quantity", "1"), "quantity", errors, index),
                amount=_decimal(event.get("amount", "0"), "amount", errors, index),
                currency=str(currency)[:3],
                tool=str(event.get("tool", ""))[:200],
                agent=str(event.get("agent", agent))[:200],
                run_id=str(event.get("run_id", ""))[:200],
                occurred_at=occurred,
            )
        )
    if errors:
        raise UsageInvalid(errors[:200])
    return rows


def ingest(tenant: Tenant, rows: list[UsageEvent]) -> int:
    for row in rows:
        row.tenant = tenant
    with tenant_scope(tenant):
        UsageEvent.objects.bulk_create(rows)
        add_spend(tenant, spend_increments(rows))
    return len(rows)


def aggregate(
    tenant: Tenant,
    *,
    group_by: str | None,
    start: datetime | None,
    end: datetime | None,
    offset: int = 0,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Totals per group (and per unit and currency: amounts are never mixed), in group
    order, from the `offset`-th group on, at most `limit` of them."""
    with tenant_scope(tenant, readonly=True):
        rows = UsageEvent.objects.for_tenant(tenant)
        if start:
            rows = rows.filter(occurred_at__gte=start)
        if end:
            rows = rows.filter(occurred_at__lt=end)
        keys = ["unit", "currency"] + ([GROUPS[group_by]] if group_by else [])
        totals = (
            rows.values(*keys)
            .annotate(events=Count("id"), quantity=Sum("quantity"), amount=Sum("amount"))
            .order_by(*keys)
        )
        totals = totals[offset:] if limit is None else totals[offset : offset + limit]
        results = []
        for row in totals:
            item: dict[str, Any] = {
                "unit": row["unit"],
                "currency": row["currency"],
                "events": row["events"],
                "quantity": format_amount(row["quantity"] or 0),
                "amount": format_amount(row["amount"] or 0),
            }
            if group_by:
                item[group_by] = row[GROUPS[group_by]] or None
            results.append(item)
    return results


def deliver_outbox(batch: int = 500) -> int:
    """Post undelivered usage to EAI_FINOPS_URL, tenant by tenant; each row once."""
    if not settings.EAI_FINOPS_URL:
        return 0
    delivered = 0
    for tenant in Tenant.objects.filter(is_active=True):
        with tenant_scope(tenant, readonly=True):
            rows = list(
                UsageEvent.objects.for_tenant(tenant)
                .filter(delivered_at=None)
                .order_by("occurred_at")[:batch]
            )
        if not rows:
            continue
        body = {"tenant": tenant.public_id, "events": [r.as_dict() for r in rows]}
        try:
            response = _POOL.request(
                "POST",
                settings.EAI_FINOPS_URL,
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Idempotency-Key": rows[0].id},
                timeout=urllib3.Timeout(total=5),
            )
        except urllib3.exceptions.HTTPError:
            logger.warning("FinOps delivery failed for %s; will retry", tenant.slug)
            continue
        if not 200 <= response.status < 300:
            logger.warning("FinOps answered %s for %s; will retry", response.status, tenant.slug)
            continue
        with tenant_scope(tenant):
            delivered += (
                UsageEvent.objects.for_tenant(tenant)
                .filter(id__in=[r.id for r in rows], delivered_at=None)
                .update(delivered_at=timezone.now())
            )
    return delivered
