"""Management commands: create_tenant, create_api_key --json, demo."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from gateway.models import Invocation, Tool
from tenants.models import ApiKey, Tenant
from tenants.scope import tenant_scope

from .conftest import Api


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_it_creates_a_tenant_once(db):
    assert "Created tenant acme" in run("create_tenant", "acme", "--name", "ACME")
    assert "Exists" in run("create_tenant", "acme")
    assert Tenant.objects.get(slug="acme").name == "ACME"
    with pytest.raises(CommandError):
        run("create_tenant", "Not A Slug")


def test_it_prints_a_key_once_as_one_json_line(db):
    run("create_tenant", "acme")
    out = run(
        "create_api_key",
        "--tenant",
        "acme",
        "--scopes",
        "tools:invoke,tools:read",
        "--agent",
        "bot",
        "--json",
    )
    lines = out.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert set(data) == {"id", "key", "tenant", "scopes", "agent"}
    assert data["id"].startswith("key_") and data["key"].startswith("eai_")
    assert data["scopes"] == ["tools:invoke", "tools:read"] and data["agent"] == "bot"
    key = ApiKey.objects.get(key_id=data["id"][4:])
    assert data["key"].split("_")[2] not in key.digest
    assert Api(data["key"]).get("/v1/tools").status_code == 200


def test_it_refuses_bad_key_arguments(db):
    run("create_tenant", "acme")
    with pytest.raises(CommandError):
        run("create_api_key", "--tenant", "nope", "--scopes", "tools:read")
    with pytest.raises(CommandError):
        run("create_api_key", "--tenant", "acme", "--scopes", "noscope")


def test_it_issues_a_reviewer_key_to_a_staff_member_of_the_tenant(db):
    from django.contrib.auth import get_user_model
    from django.db.models import ProtectedError

    from gateway.keys import issue_api_key
    from tenants.models import Membership

    run("create_tenant", "acme")
    run("create_tenant", "globex")
    acme = Tenant.objects.get(slug="acme")
    users = get_user_model().objects
    rita = users.create_user("rita", is_staff=True)
    Membership.objects.create(user=rita, tenant=acme)
    outsider = users.create_user("otto", is_staff=True)
    Membership.objects.create(user=outsider, tenant=Tenant.objects.get(slug="globex"))
    users.create_user("agent-person")  # not staff
    data = json.loads(
        run(
            "create_api_key",
            "--tenant",
            "acme",
            "--scopes",
            "approvals:decide",
            "--user",
            "rita",
            "--json",
        )
    )
    key = ApiKey.objects.get(key_id=data["id"][4:])
    assert key.user == rita and key.created_by is None  # the platform issued it
    for name in ("otto", "agent-person", "nobody"):
        with pytest.raises(CommandError, match="No active staff user"):
            run(
                "create_api_key", "--tenant", "acme", "--scopes", "approvals:decide", "--user", name
            )
    # An issuer cannot be deleted: its keys issued to others would pass as the platform's.
    issue_api_key(tenant=acme, scopes=["approvals:decide"], user=rita, created_by=outsider)
    with pytest.raises(ProtectedError):
        outsider.delete()


@pytest.mark.django_db(transaction=True)
def test_the_demo_seeds_a_run_waiting_for_approval(db):
    import socket

    with socket.socket() as probe:  # a free port for the demo MCP server, served for the seed
        probe.bind(("127.0.0.1", 0))
        mcp_port = str(probe.getsockname()[1])
    out = run("demo", "--mcp-port", mcp_port)
    assert "EAI_DEMO_AGENT_KEY=eai_" in out and "reviewer /" in out
    acme = Tenant.objects.get(slug="acme")
    assert Tenant.objects.filter(slug="globex").exists()
    with tenant_scope(acme, readonly=True):  # this test's own reads: no request set it
        names = set(Tool.objects.filter(tenant=acme).values_list("name", flat=True))
    assert names == {
        "jira.search",
        "payments.transfer",
        "hr.payroll",
        "report.summary",
        "crm.lookup",
        "kb.search",  # on the demo MCP server, served for the seed
    }
    with tenant_scope(acme, readonly=True):
        statuses = list(
            Invocation.objects.filter(tenant=acme, run_id="run_demo")
            .order_by("step_index")
            .values_list("tool", "status")
        )
    assert statuses == [("jira.search", "succeeded"), ("payments.transfer", "waiting_approval")]
    run("demo", "--mcp-port", mcp_port)  # seeding again changes nothing in the run
    from gateway.models import Event

    with tenant_scope(acme, readonly=True):
        assert Invocation.objects.filter(tenant=acme, run_id="run_demo").count() == 2
        types = list(
            Event.objects.filter(tenant=acme, run_id="run_demo").values_list("type", flat=True)
        )
    assert types == [
        "agent.turn.started",
        "agent.tool.requested",
        "agent.tool.started",
        "agent.tool.completed",
        "agent.plan.updated",
        "agent.tool.requested",
        "agent.authorization.required",
    ]


def test_the_production_settings_pass_the_deploy_checks():
    import os
    import subprocess
    import sys

    from django.conf import settings

    env = {
        **os.environ,
        "EAI_SECRET_KEY": "k" * 20 + "-production-secret-key-for-the-check-0123456789",
        "EAI_HTTPS": "1",
        "EAI_DEBUG": "0",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
