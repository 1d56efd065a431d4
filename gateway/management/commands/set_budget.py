"""`manage.py set_budget --tenant SLUG --amount 100.00 --currency EUR` (SPEC §8)."""

from __future__ import annotations

import re
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from gateway import audit, finops
from gateway.models import format_amount
from tenants.models import Tenant
from tenants.scope import tenant_scope

# What Tenant.monthly_budget holds (18 digits, 6 of them decimals), written as amounts
# are written: no sign, no exponent.
AMOUNT_RE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?\Z")
CURRENCY_RE = re.compile(r"[A-Z]{3}\Z")


def set_budget(tenant: Tenant, *, amount: Decimal | None, currency: str, actor: str) -> None:
    """Set (or, `amount` None, remove) the tenant's monthly budget, with its chained
    `tenant.budget_set` audit event in the same transaction. Serving processes apply it
    within `finops.BUDGET_CACHE_S`."""
    with tenant_scope(tenant):
        before = (
            Tenant.objects.select_for_update()
            .filter(pk=tenant.pk)
            .values_list("monthly_budget", "budget_currency")
            .get()
        )
        Tenant.objects.filter(pk=tenant.pk).update(monthly_budget=amount, budget_currency=currency)
        payload = {
            "amount": None if amount is None else format_amount(amount),
            "currency": currency,
            "previous_amount": None if before[0] is None else format_amount(before[0]),
            "previous_currency": before[1],
        }
        audit.record(tenant, [audit.Entry("tenant.budget_set", actor, tenant.public_id, payload)])
    tenant.monthly_budget, tenant.budget_currency = amount, currency
    finops.forget_budgets()


class Command(BaseCommand):
    help = (
        "Set a tenant's monthly budget (calls it cannot cover answer 403 budget_exceeded), "
        "or remove it with --amount none. Audited; serving processes apply it within 1 s."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument(
            "--amount",
            required=True,
            help="The budget per calendar month, e.g. 100.00 (at most 6 decimals), or none.",
        )
        parser.add_argument(
            "--currency",
            help="ISO 4217 code of the budget, e.g. EUR (default: the tenant's current one).",
        )

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        raw = options["amount"].strip()
        if raw.lower() == "none":
            amount = None
        elif AMOUNT_RE.match(raw):
            amount = Decimal(raw)
        else:
            raise CommandError(
                f"--amount must be an amount like 100.00 (0 to 999999999999.999999) or none, "
                f"not {raw[:40]!r}."
            )
        currency = options["currency"] or tenant.budget_currency
        if not CURRENCY_RE.match(currency):
            raise CommandError(
                f"--currency must be an ISO 4217 code like EUR, not {currency[:40]!r}."
            )
        set_budget(tenant, amount=amount, currency=currency, actor="cli")
        if amount is None:
            self.stdout.write(f"Removed the monthly budget of tenant {tenant.slug}.")
        else:
            self.stdout.write(
                f"Set the monthly budget of tenant {tenant.slug} to {format_amount(amount)} "
                f"{currency}."
            )
