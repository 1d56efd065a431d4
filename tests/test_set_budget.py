"""`manage.py set_budget` (SPEC §8): sets or removes a tenant's monthly budget, audited
in the same transaction, and serving processes apply it within a second."""

from __future__ import annotations

import io
import json
import time
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gateway import finops
from gateway.audit import verify_chain
from gateway.models import AuditEvent
from tenants.models import Tenant
from tenants.scope import tenant_scope

from .conftest import error_of


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("set_budget", *args, stdout=out)
    return out.getvalue()


def _budget_events(tenant) -> list[dict]:
    with tenant_scope(tenant, readonly=True):
        rows = AuditEvent.objects.filter(tenant=tenant, action="tenant.budget_set")
        return [json.loads(row.canonical)["payload"] for row in rows.order_by("seq")]


def test_it_sets_and_removes_a_budget_with_an_audit_event(alice, bob):
    acme, globex = alice.key.tenant, bob.key.tenant
    out = _run("--tenant", "acme", "--amount", "100.00", "--currency", "USD")
    assert "100 USD" in out
    acme.refresh_from_db()
    assert (acme.monthly_budget, acme.budget_currency) == (Decimal("100"), "USD")
    _run("--tenant", "acme", "--amount", "none")
    acme.refresh_from_db()
    assert acme.monthly_budget is None and acme.budget_currency == "USD"
    assert _budget_events(acme) == [
        {"amount": "100", "currency": "USD", "previous_amount": None, "previous_currency": "EUR"},
        {"amount": None, "currency": "USD", "previous_amount": "100", "previous_currency": "USD"},
    ]
    with tenant_scope(acme, readonly=True):
        assert verify_chain(acme)["valid"] is True
    globex.refresh_from_db()
    assert globex.monthly_budget is None and _budget_events(globex) == []


def test_a_budget_set_takes_effect_on_the_next_calls(alice, bob):
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    _run("--tenant", "acme", "--amount", "0.001", "--currency", "EUR")
    response = alice.invoke("jira.search", {"q": "x"})
    assert error_of(response)["code"] == "budget_exceeded"
    assert bob.invoke("jira.search", {"q": "x"}).status_code == 200
    _run("--tenant", "acme", "--amount", "none")
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tenant", "nobody", "--amount", "1"], "No tenant"),
        (["--tenant", "acme", "--amount", "-1"], "--amount must be"),
        (["--tenant", "acme", "--amount", "1e3"], "--amount must be"),
        (["--tenant", "acme", "--amount", "1.1234567"], "--amount must be"),
        (["--tenant", "acme", "--amount", "1000000000000"], "--amount must be"),
        (["--tenant", "acme", "--amount", "NaN"], "--amount must be"),
        (["--tenant", "acme", "--amount", "1", "--currency", "eur"], "--currency must be"),
        (["--tenant", "acme", "--amount", "1", "--currency", "EURO"], "--currency must be"),
    ],
)
def test_it_refuses_bad_input(alice, args, message):
    with pytest.raises(CommandError, match=message):
        _run(*args)
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.monthly_budget is None and _budget_events(tenant) == []


def test_it_has_help():
    from gateway.management.commands.set_budget import Command

    text = Command().create_parser("manage.py", "set_budget").format_help()
    assert "--amount" in text and "none" in text and "--currency" in text


@pytest.mark.django_db(transaction=True)
def test_another_process_applies_it_within_a_second(alice):
    """The serving process keeps what it read of the budget for at most
    BUDGET_CACHE_S; a budget set elsewhere (its cache untouched here) holds after."""
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200  # cached: no budget
    # As another process would: the row changes, this process's cache is not told.
    Tenant.objects.filter(slug="acme").update(monthly_budget=Decimal("0.001"))
    time.sleep(finops.BUDGET_CACHE_S + 0.05)
    assert error_of(alice.invoke("jira.search", {"q": "x"}))["code"] == "budget_exceeded"
    assert finops.BUDGET_CACHE_S <= 1.0
