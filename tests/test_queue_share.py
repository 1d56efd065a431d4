"""A tenant's queued calls (`Prefer: respond-async`) are bounded (SPEC §14): they wait in
one queue with every tenant's (the broker's, or a server process's pool), so past
`EAI_TENANT_QUEUED_MAX` a tenant's next one answers 429 `rate_limited` with Retry-After,
its decision stored and the refusal chained, and no other tenant is held behind more
than that many of its calls. Under the default test database the queued calls stay
queued (their run waits for a commit the test never makes), as behind a busy worker."""

from __future__ import annotations

import json

from django.test import override_settings

from gateway.models import AuditEvent, Invocation
from tenants.scope import tenant_scope

from .conftest import error_of

ASYNC = {"Prefer": "respond-async"}


def queued(api):
    with tenant_scope(api.key.tenant, readonly=True):
        return Invocation.objects.for_tenant(api.key.tenant).filter(status="queued").count()


@override_settings(EAI_TENANT_QUEUED_MAX=3)
def test_a_tenant_past_its_queued_calls_waits_and_no_other_tenant_does(alice, bob):
    for n in range(3):
        response = alice.invoke("jira.search", {"q": f"INC-{n}"}, headers=ASYNC)
        assert response.status_code == 202 and response.json()["status"] == "queued"
    french = {**ASYNC, "Accept-Language": "fr"}
    refused = alice.invoke("jira.search", {"q": "INC-9"}, headers=french)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "5"
    error = error_of(refused)
    assert error["code"] == "rate_limited" and error["decision_id"].startswith("dec_")
    assert error["message"] == error["message_i18n"]["fr"]
    assert queued(alice) == 3  # nothing more was queued
    with tenant_scope(alice.key.tenant, readonly=True):
        entry = AuditEvent.objects.for_tenant(alice.key.tenant).get(action="tool.queue_full")
        payload = json.loads(entry.canonical)["payload"]
    assert payload["decision_id"] == error["decision_id"] and payload["queued_max"] == 3
    # A call that parks for approval is not queued: the bound does not refuse it.
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1.00"}, ASYNC
    )
    assert parked.status_code == 202 and parked.json()["status"] == "waiting_approval"
    # Another tenant queues as before, and alice's synchronous calls still run.
    assert bob.invoke("jira.search", {"q": "INC-1"}, headers=ASYNC).status_code == 202
    assert alice.invoke("jira.search", {"q": "INC-2"}).status_code == 200


@override_settings(EAI_TENANT_QUEUED_MAX=0)
def test_zero_means_no_bound(alice):
    for n in range(5):
        assert alice.invoke("jira.search", {"q": f"INC-{n}"}, headers=ASYNC).status_code == 202
    assert queued(alice) == 5
