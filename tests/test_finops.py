"""Usage events, aggregates, the monthly budget and delivery to a FinOps service."""

import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings

from gateway import finops
from gateway.models import Invocation, UsageEvent
from tenants.scope import tenant_scope

from .conftest import error_of, scope


def test_every_finished_call_writes_a_tool_call_usage_event(alice):
    body = alice.invoke("jira.search", {"q": "x"}, run_id="run_u").json()
    with scope(alice.key.tenant):
        usage = UsageEvent.objects.get(invocation_id=body["invocation_id"])
    assert (usage.unit, usage.amount, usage.currency) == ("tool_call", Decimal("0.001"), "EUR")
    assert usage.tool == "jira.search" and usage.run_id == "run_u" and usage.agent == "alice-agent"
    alice.invoke("secret.tool", {})  # denied: costs nothing
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}
    )
    assert parked.status_code == 202
    with scope(alice.key.tenant):
        assert UsageEvent.objects.count() == 1


def test_it_aggregates_by_tool_agent_and_run(alice, make_api):
    other = make_api(alice.key.tenant, agent="other-agent")
    for _ in range(3):
        alice.invoke("jira.search", {"q": "x"}, run_id="run_1")
    other.invoke("jira.search", {"q": "x"}, run_id="run_2")
    by_tool = alice.get("/v1/finops/usage", group_by="tool").json()
    assert by_tool["results"] == [
        {
            "unit": "tool_call",
            "currency": "EUR",
            "events": 4,
            "quantity": "4",
            "amount": "0.004",
            "tool": "jira.search",
        }
    ]
    by_agent = {
        r["agent"]: r["amount"]
        for r in alice.get("/v1/finops/usage", group_by="agent").json()["results"]
    }
    assert by_agent == {"alice-agent": "0.003", "other-agent": "0.001"}
    by_run = {
        r["run"]: r["events"]
        for r in alice.get("/v1/finops/usage", group_by="run").json()["results"]
    }
    assert by_run == {"run_1": 3, "run_2": 1}
    future = alice.get("/v1/finops/usage", **{"from": "2999-01-01"}).json()
    assert future["results"] == []


def test_usage_aggregates_page_like_every_list(alice):
    for run in ("run_a", "run_b", "run_c", "run_d", "run_e"):
        alice.invoke("jira.search", {"q": "x"}, run_id=run)
    seen, cursor, pages = [], None, 0
    while True:
        params = {"group_by": "run", "limit": "2", **({"cursor": cursor} if cursor else {})}
        body = alice.get("/v1/finops/usage", **params).json()
        assert len(body["results"]) <= 2
        seen += [r["run"] for r in body["results"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == ["run_a", "run_b", "run_c", "run_d", "run_e"] and pages == 3
    every = alice.get("/v1/finops/usage", group_by="run").json()
    assert len(every["results"]) == 5 and every["next_cursor"] is None
    for cursor in ("x", "-1", str(2**64)):
        bad = alice.get("/v1/finops/usage", group_by="run", cursor=cursor)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"
    huge = alice.get("/v1/events", cursor=str(2**64))
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "invalid_cursor"


def test_clients_report_usage(alice, bob):
    response = alice.post(
        "/v1/finops/usage",
        {
            "events": [
                {
                    "unit": "llm_tokens",
                    "quantity": "1200",
                    "amount": "0.018",
                    "currency": "EUR",
                    "run_id": "run_9",
                },
                {"unit": "llm_tokens", "quantity": "800", "amount": "0.012"},
            ]
        },
    )
    assert response.status_code == 201
    assert response.json()["accepted"] == 2
    totals = alice.get("/v1/finops/usage").json()["results"]
    assert totals == [
        {"unit": "llm_tokens", "currency": "EUR", "events": 2, "quantity": "2000", "amount": "0.03"}
    ]
    assert bob.get("/v1/finops/usage").json()["results"] == []


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"events": [{"amount": "1"}]}, "/events/0/unit"),
        ({"events": [{"unit": "x", "amount": "-1"}]}, "/events/0/amount"),
        ({"events": [{"unit": "x", "amount": "abc"}]}, "/events/0/amount"),
        ({"events": [{"unit": "x", "currency": "euro"}]}, "/events/0/currency"),
        ({"events": [{"unit": "x", "colour": "red"}]}, "/events/0/colour"),
        ({"events": [{"unit": "x", "occurred_at": "yesterday"}]}, "/events/0/occurred_at"),
        ({"events": []}, "/events"),
        ({"events": ["x"]}, "/events/0"),
    ],
)
def test_it_refuses_bad_usage_and_records_none(alice, body, path):
    response = alice.post("/v1/finops/usage", body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "usage_invalid"
    assert path in [e["path"] for e in error["details"]["errors"]]
    with scope(alice.key.tenant):
        assert not UsageEvent.objects.exists()


def test_it_refuses_a_bad_group_or_time(alice):
    assert error_of(alice.get("/v1/finops/usage", group_by="planet"))["code"] == "invalid_request"
    assert error_of(alice.get("/v1/finops/usage", to="soon"))["code"] == "invalid_request"


def test_it_needs_the_finops_scopes(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:invoke"])
    assert error_of(api.get("/v1/finops/usage"))["code"] == "insufficient_scope"
    assert error_of(api.post("/v1/finops/usage", {"unit": "x"}))["code"] == "insufficient_scope"


def test_a_spent_budget_denies_calls(alice):
    tenant = alice.key.tenant
    tenant.monthly_budget = Decimal("0.002")
    tenant.save()
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    response = alice.invoke("jira.search", {"q": "x"}, headers={"Accept-Language": "fr"})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "budget_exceeded"
    assert error["message"] == "Le budget mensuel du locataire, 0.002 EUR, est épuisé."
    assert error["decision_id"].startswith("dec_")
    with scope(alice.key.tenant):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "denied"
    assert finops.spent_this_month(tenant) == Decimal("0.002")


def _spend_rows(tenant):
    from gateway.models import MonthlySpend

    with tenant_scope(tenant, readonly=True):
        rows = MonthlySpend.objects.filter(tenant=tenant).values_list("month", "currency", "amount")
        return {(month, currency): amount for month, currency, amount in rows}


def _usage_sums(tenant):
    totals = {}
    with tenant_scope(tenant, readonly=True):
        events = list(UsageEvent.objects.filter(tenant=tenant).exclude(amount=0))
    for event in events:
        key = (finops.month_of(event.occurred_at), event.currency)
        totals[key] = totals.get(key, Decimal(0)) + event.amount
    return totals


def test_the_monthly_spend_moves_with_every_usage_event(alice, bob, make_api):
    """Calls (written once, and settled after a running claim), reported usage in
    several months and currencies: the per-month sums always equal the events'."""
    from gateway.manifests import apply_manifests

    from .conftest import tool_manifest

    tenant = alice.key.tenant
    apply_manifests(
        tenant=tenant,
        documents=[
            tool_manifest(
                "paid.write",
                {"type": "builtin", "callable": "echo"},
                cost={"amount": "0.25", "currency": "EUR"},
                idempotent=False,
            )
        ],
    )
    for _ in range(3):
        assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    assert alice.invoke("paid.write", {}).status_code == 200
    response = alice.post(
        "/v1/finops/usage",
        {
            "events": [
                {"unit": "llm_tokens", "amount": "1.5"},
                {"unit": "llm_tokens", "amount": "2", "currency": "USD"},
                {"unit": "llm_tokens", "amount": "4", "occurred_at": "2026-01-31T23:30:00+00:00"},
                {"unit": "llm_tokens", "amount": "0"},
            ]
        },
    )
    assert response.status_code == 201
    assert bob.invoke("jira.search", {"q": "x"}).status_code == 200
    spend = _spend_rows(tenant)
    assert spend == _usage_sums(tenant)
    # 23:30 UTC on 31 January is already February in Paris, the budget's time zone.
    assert spend[(finops.month_of(finops.timezone.now()), "EUR")] == Decimal("1.753")
    assert [k for k in spend if k[0].year == 2026 and k[0].month in (1, 2)] == [
        (finops.date(2026, 2, 1), "EUR")
    ]
    assert _spend_rows(bob.key.tenant) == _usage_sums(bob.key.tenant)
    assert finops.spent_this_month(tenant) == Decimal("1.753")


def test_the_budget_check_reads_the_monthly_spend(alice):
    """The check sums a month's few spend rows, not its usage events."""
    from gateway.models import MonthlySpend

    tenant = alice.key.tenant
    tenant.monthly_budget = Decimal("10")
    tenant.save()
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    with scope(tenant):
        MonthlySpend.objects.filter(tenant=tenant).update(amount=Decimal("10"))
    response = alice.invoke("jira.search", {"q": "x"})
    assert response.status_code == 403
    assert error_of(response)["code"] == "budget_exceeded"


def test_reported_amounts_are_kept_to_six_decimals_everywhere(alice):
    """Rounded once, when received: the stored events, their aggregate and the budget's
    running total agree (summing unrounded values would drift from the events)."""
    events = [{"unit": "llm_tokens", "amount": "0.0000014"}] * 10
    events += [{"unit": "llm_tokens", "amount": "0.0000015"}]
    assert alice.post("/v1/finops/usage", {"events": events}).status_code == 201
    tenant = alice.key.tenant
    with tenant_scope(tenant, readonly=True):
        stored = sorted({e.amount for e in UsageEvent.objects.filter(tenant=tenant)})
    assert stored == [Decimal("0.000001"), Decimal("0.000002")]
    totals = alice.get("/v1/finops/usage").json()["results"]
    assert totals[0]["amount"] == "0.000012"
    assert finops.spent_this_month(tenant) == Decimal("0.000012")
    assert _spend_rows(tenant) == _usage_sums(tenant)


def test_on_postgresql_any_usage_row_written_moves_the_spend(db):
    """A trigger counts rows whatever writes them (an older release during a deploy, a
    bulk load): not only the gateway's own write paths."""
    from django.db import connection

    from tenants.models import Tenant
    from tenants.scope import tenant_scope

    if connection.vendor != "postgresql":
        pytest.skip("the trigger is PostgreSQL's; elsewhere finops.add_spend does it")
    tenant = Tenant.objects.create(slug="bulk", name="Bulk")
    with tenant_scope(tenant):
        UsageEvent.objects.bulk_create(
            UsageEvent(id=f"use_bulk{i}", tenant=tenant, unit="x", amount=Decimal("0.5"))
            for i in range(4)
        )
    assert finops.spent_this_month(tenant) == Decimal("2")
    assert _spend_rows(tenant) == _usage_sums(tenant)


class _FinOps(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        return

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.batches.append(body)
        status = 503 if self.server.fail else 202
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_the_outbox_is_delivered_once_and_retried_on_failure(alice):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FinOps)
    server.batches, server.fail = [], True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        alice.invoke("jira.search", {"q": "x"})
        with override_settings(EAI_FINOPS_URL=f"http://127.0.0.1:{server.server_address[1]}/usage"):
            assert finops.deliver_outbox() == 0  # the service is down: kept for later
            server.fail = False
            assert finops.deliver_outbox() == 1
            assert finops.deliver_outbox() == 0  # nothing twice
        assert len(server.batches) == 2
        event = server.batches[-1]["events"][0]
        assert event["unit"] == "tool_call" and event["amount"] == "0.001"
        with scope(alice.key.tenant):
            assert UsageEvent.objects.filter(delivered_at=None).count() == 0
    finally:
        server.shutdown()
        server.server_close()


MAX_COST_POLICY = """package eai.tool

import rego.v1

obligations contains {"type": "max_cost", "amount": "1.00", "currency": "EUR"} if {
\tstartswith(input.tool.name, "capped.")
}

obligations contains {"type": "max_cost", "amount": "1.00", "currency": "USD"} if {
\tinput.tool.name == "dollars.cheap"
}

obligations contains {"type": "max_cost", "amount": "lots"} if {
\tinput.tool.name == "unreadable.cap"
}

obligations contains {"type": "max_cost", "amount": "1e-999999999"} if {
\tinput.tool.name == "tiny.cap"
}
"""


def test_a_max_cost_obligation_denies_calls_that_cost_more(alice):
    from gateway.manifests import apply_manifests

    from .conftest import tool_manifest

    echo = {"type": "builtin", "callable": "echo"}
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest("capped.dear", echo, cost={"amount": "5", "currency": "EUR"}),
            tool_manifest("capped.cheap", echo, cost={"amount": "0.5", "currency": "EUR"}),
            tool_manifest("capped.exact", echo, cost={"amount": "1", "currency": "EUR"}),
            tool_manifest("dollars.cheap", echo, cost={"amount": "0.5", "currency": "EUR"}),
            tool_manifest("unreadable.cap", echo, cost={"amount": "0.5", "currency": "EUR"}),
            tool_manifest("tiny.cap", echo, cost={"amount": "0.5", "currency": "EUR"}),
            {
                "apiVersion": "eai/v1",
                "kind": "Policy",
                "metadata": {"name": "cost-cap", "version": "1"},
                "spec": {"rego": MAX_COST_POLICY},
            },
        ],
    )
    for tool in ("capped.cheap", "capped.exact"):
        assert alice.invoke(tool, {}).status_code == 200
    denied = alice.invoke("capped.dear", {}, headers={"Accept-Language": "fr"})
    assert denied.status_code == 403
    error = error_of(denied)
    assert error["code"] == "policy_denied" and error["decision_id"].startswith("dec_")
    assert "costs 5 EUR, over max_cost 1 EUR" in error["message_i18n"]["en"]
    assert "l’appel coûte 5 EUR" in error["message"]
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=error["invocation_id"])
    assert stored.status == "denied" and stored.output is None
    with scope(alice.key.tenant):
        assert not UsageEvent.objects.filter(invocation_id=stored.pk).exists()
    # a cap the gateway cannot honour denies rather than waves through
    for tool in ("dollars.cheap", "unreadable.cap", "tiny.cap"):
        response = alice.invoke(tool, {})
        assert response.status_code == 403, tool
        assert error_of(response)["code"] == "policy_denied"
        assert len(response.content) < 2000  # a cap's exponent never makes its message


@pytest.mark.parametrize(
    ("event", "path"),
    [
        ({"unit": "t", "amount": "5.00", "occurred_at": "2099-06-01T00:00:00Z"}, "occurred_at"),
        ({"unit": "t", "amount": "1e3"}, "amount"),
        ({"unit": "t", "amount": "1", "run_id": "bad id"}, "run_id"),
        ({"unit": "t", "amount": "1", "run_id": "run_x\n"}, "run_id"),
        ({"unit": "t", "amount": "1", "tool": "x" * 201}, "tool"),
    ],
)
def test_usage_events_that_cannot_be_true_are_refused(alice, event, path):
    response = alice.post("/v1/finops/usage", {"events": [event]})
    assert response.status_code == 400, response.content
    assert error_of(response)["details"]["errors"][0]["path"] == f"/events/0/{path}"


def test_a_bare_array_of_usage_events_is_read_as_events(alice):
    response = alice.post("/v1/finops/usage", [{"unit": "t", "amount": "0.5"}])
    assert response.status_code == 201, response.content
    assert alice.post("/v1/finops/usage", []).status_code == 400


def test_a_range_that_ends_before_it_starts_is_refused(alice):
    response = alice.get(
        "/v1/finops/usage", **{"from": "2026-02-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}
    )
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_request"


def test_a_small_amount_sent_as_a_json_number_is_kept(alice):
    response = alice.post("/v1/finops/usage", {"events": [{"unit": "token", "amount": 0.00002}]})
    assert response.status_code == 201, response.content


def test_a_day_that_does_not_exist_is_refused_not_a_500(alice):
    event = {"unit": "t", "amount": "1", "occurred_at": "2026-02-30T00:00:00"}
    response = alice.post("/v1/finops/usage", {"events": [event]})
    assert response.status_code == 400
    assert error_of(response)["details"]["errors"][0]["path"] == "/events/0/occurred_at"


@pytest.mark.django_db(transaction=True)
def test_a_queued_call_holds_its_cost_until_it_runs(alice):
    """Admitted with room left, a queued call reserves its cost at once: a call made
    before it runs cannot spend that room (forty async calls at once all ran, 35 EUR
    over the budget), and the queued call runs on its reservation."""
    import time

    tenant = alice.key.tenant
    tenant.monthly_budget = Decimal("0.002")
    tenant.save()
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    from gateway import pipeline

    gate = threading.Event()
    original = pipeline.execute_queued

    def held(invocation_id, tenant_):
        gate.wait(10)
        return original(invocation_id, tenant_)

    pipeline.execute_queued = held
    try:
        queued = alice.invoke("jira.search", {"q": "y"}, headers={"Prefer": "respond-async"})
        assert queued.status_code == 202, queued.content
        refused = alice.invoke("jira.search", {"q": "z"})
        assert refused.status_code == 403
        assert error_of(refused)["code"] == "budget_exceeded"
        gate.set()
        invocation_id = queued.json()["invocation_id"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = alice.get(f"/v1/tools/invocations/{invocation_id}").json()
            if got["status"] not in ("queued", "running"):
                break
            time.sleep(0.05)
    finally:
        pipeline.execute_queued = original
    assert got["status"] == "succeeded", got
    assert finops.spent_this_month(tenant) == Decimal("0.002")


@pytest.mark.django_db(transaction=True)
@override_settings(EAI_BROKER_URL="")  # the embedded default: the server's own runner
def test_a_queued_call_lost_with_its_process_is_sent_again(alice):
    """The embedded default's runner is a pool of the server's threads: a call waiting
    in it when the process died stayed `queued` for good. The recovery sweep sends it
    again once it has waited past the grace; it runs once."""
    from datetime import timedelta

    from gateway import pipeline

    original = pipeline.execute_queued
    taken = threading.Event()

    def died(invocation_id, tenant_):  # the runner's process died with the call
        taken.set()

    pipeline.execute_queued = died
    try:
        queued = alice.invoke("jira.search", {"q": "INC-77"}, headers={"Prefer": "respond-async"})
        assert taken.wait(10)
    finally:
        pipeline.execute_queued = original
    invocation_id = queued.json()["invocation_id"]
    assert alice.get(f"/v1/tools/invocations/{invocation_id}").json()["status"] == "queued"
    assert pipeline.recover_stuck(alice.key.tenant, grace_s=60) == 0  # not yet
    with tenant_scope(alice.key.tenant):
        Invocation.objects.filter(pk=invocation_id).update(
            created_at=Invocation.objects.get(pk=invocation_id).created_at - timedelta(seconds=61)
        )
    assert pipeline.recover_stuck(alice.key.tenant, grace_s=60) == 1
    # Held by the runner now: a sweep meanwhile does not queue it a second time.
    assert pipeline.recover_stuck(alice.key.tenant, grace_s=60) in (0, 1)
    got = alice.get(f"/v1/tools/invocations/{invocation_id}", wait=20).json()
    assert got["status"] == "succeeded" and got["output"]["issues"][0]["key"] == "INC-77"


@pytest.mark.parametrize(
    ("moment", "as_bound"),
    [
        ("0001-01-01", 200),  # a query's bound out of range is its nearest end
        ("9999-12-31T23:59:59-14:00", 200),
        ("2026-01-01T25:00:00", 400),
        ("2026-01-01T00:00:00+99:00", 400),
        ("2026-02-30", 400),
    ],
)
def test_times_out_of_range_are_refused_not_a_500(alice, moment, as_bound):
    for param in ("from", "to"):
        response = alice.get("/v1/finops/usage", **{param: moment})
        assert response.status_code == as_bound, (param, moment, response.content)
        if as_bound == 400:
            assert error_of(response)["code"] == "invalid_request"
    when = moment if "T" in moment else moment + "T00:00:00"
    posted = alice.post(
        "/v1/finops/usage", {"events": [{"unit": "u", "quantity": "1", "occurred_at": when}]}
    )
    assert posted.status_code == 400, posted.content
    assert error_of(posted)["details"]["errors"][0]["path"] == "/events/0/occurred_at"
