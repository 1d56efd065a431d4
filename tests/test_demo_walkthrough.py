"""The demo's agent run, walked to the end as a new user would: the seeded transfer
waits, the reviewer approves it, the agent resumes the run and reads the result."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from approvals.decisions import decide
from gateway.models import ApprovalRequest, Event
from tenants.models import Tenant
from tenants.scope import tenant_scope

from .conftest import Api


@pytest.mark.django_db(transaction=True)
def test_the_demo_run_reaches_its_result_after_approval():
    out = io.StringIO()
    call_command("demo", stdout=out)
    key = next(
        line.split("=", 1)[1]
        for line in out.getvalue().splitlines()
        if line.startswith("EAI_DEMO_AGENT_KEY=")
    )
    agent = Api(key)
    acme = Tenant.objects.get(slug="acme")
    waiting = agent.get("/v1/runs/run_demo").json()
    assert waiting["status"] == "waiting"
    with tenant_scope(acme, readonly=True):
        approval = ApprovalRequest.objects.get(tenant=acme, status="pending")
    reviewer = get_user_model().objects.get(username="reviewer")
    decide(
        tenant=acme,
        approval_id=approval.id,
        reviewer=reviewer,
        verdict="approve",
        reason="refund matches INC-42",
    )
    done = agent.get(f"/v1/tools/invocations/{approval.invocation_id}", wait=10).json()
    assert done["status"] == "succeeded"
    assert done["output"]["status"] == "executed"
    assert done["input"]["iban"] == "FR76*******************0189"
    resumed = agent.post("/v1/runs/run_demo/resume").json()
    assert resumed["status"] == "completed"
    with tenant_scope(acme, readonly=True):
        types = list(
            Event.objects.filter(tenant=acme, run_id="run_demo").values_list("type", flat=True)
        )
    assert types[-5:] == [
        "agent.authorization.required",
        "agent.authorization.decided",
        "agent.tool.started",
        "agent.tool.completed",
        "agent.turn.completed",
    ]
