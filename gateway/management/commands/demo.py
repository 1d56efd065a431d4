"""`manage.py demo`: seed the demo tenants, tools, reviewer, agent key and agent run."""

import contextlib
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from guardian.shortcuts import assign_perm

from gateway import audit, demo, metrics, pipeline, runs
from gateway.keys import issue_api_key
from gateway.manifests import ManifestInvalid, apply_manifests
from gateway.models import Run, Tool
from tenants.models import Membership, Tenant
from tenants.scope import tenant_scope

REVIEWER_MODELS = [
    "invocation",
    "decision",
    "tool",
    "manifestversion",
    "approvalrequest",
    "approvaldecision",
    "auditevent",
    "auditcheckpoint",
    "event",
    "usageevent",
]


class Command(BaseCommand):
    help = (
        "Seed tenants acme and globex, the demo tools, a reviewer and an agent key, and "
        "walk a deterministic agent run up to a payment waiting for approval."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--upstream-port",
            type=int,
            default=settings.EAI_DEMO_UPSTREAM_PORT,
            help="Port of the demo HTTP upstream (crm.lookup).",
        )
        parser.add_argument(
            "--mcp-port",
            type=int,
            default=settings.EAI_DEMO_MCP_PORT,
            help="Port of the demo MCP server (kb.search).",
        )
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")

    def handle(self, *args, **options):
        port, base = options["upstream_port"], options["base_url"].rstrip("/")
        tenants = []
        for slug, name in (("acme", "ACME Banque"), ("globex", "Globex Assurances")):
            tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
            apply_manifests(tenant=tenant, documents=demo.manifests(port), actor="demo")
            tenants.append(tenant)
        self._apply_mcp_tool(tenants, options["mcp_port"])
        acme = tenants[0]

        password = secrets.token_urlsafe(12)
        user_model = get_user_model()
        reviewer, _ = user_model.objects.get_or_create(
            username="reviewer", defaults={"email": "reviewer@acme.example"}
        )
        reviewer.is_staff = True
        reviewer.set_password(password)
        reviewer.save()
        group, _ = Group.objects.get_or_create(name="Reviewers")
        group.permissions.set(
            Permission.objects.filter(codename__in=[f"view_{m}" for m in REVIEWER_MODELS])
        )
        reviewer.groups.add(group)
        Membership.objects.get_or_create(tenant=acme, user=reviewer)
        # The per-tool right to decide payment approvals (idempotent on reseeding).
        with tenant_scope(acme, readonly=True):
            payments = Tool.objects.for_tenant(acme).get(name="payments.transfer")
        assign_perm("gateway.review_tool", reviewer, payments)

        key, raw = issue_api_key(
            tenant=acme, scopes=demo.AGENT_SCOPES, agent="demo-agent", name="demo"
        )
        self._walk_demo_run(key)

        out = self.stdout
        out.write("")
        out.write("EAI Tool Gateway demo is seeded.")
        out.write(f"  Admin portal:   {base}/admin/")
        out.write(f"  Reviewer login: reviewer / {password}")
        out.write(f"  Agent API key:  {raw}  (tenant acme, shown once)")
        out.write(f"  API docs:       {base}/v1/docs")
        out.write("  Try:")
        out.write(
            f"    curl -s -X POST {base}/v1/tools/jira.search/invoke "
            f"-H 'Authorization: Bearer {raw}' -H 'Content-Type: application/json' "
            """-d '{"input": {"q": "INC-42"}, "run_id": "run_01J9", "step_index": 4}'"""
        )
        out.write("  A sandboxed tool (a Python program under bubblewrap, no network):")
        out.write(
            f"    curl -s -X POST {base}/v1/tools/report.summary/invoke "
            f"-H 'Authorization: Bearer {raw}' -H 'Content-Type: application/json' "
            """-d '{"input": {"rows": [{"amount": "12.50"}, {"amount": "7.25"}]}}'"""
        )
        out.write(
            f"    curl -s -X POST {base}/v1/tools/kb.search/invoke "
            f"-H 'Authorization: Bearer {raw}' -H 'Content-Type: application/json' "
            """-d '{"input": {"query": "refund"}}'   # a tool on the demo MCP server"""
        )
        out.write(f"  MCP server:     {base}/v1/mcp  (Streamable HTTP; header below)")
        out.write(f"    Authorization: Bearer {raw}")
        out.write(
            f"    curl -s -X POST {base}/v1/mcp -H 'Authorization: Bearer {raw}' "
            "-H 'Content-Type: application/json' -H 'MCP-Protocol-Version: 2025-11-25' "
            """-d '{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'"""
        )
        out.write("  The demo run run_demo waits for a reviewer: approve it in the admin, then")
        out.write(
            f"    curl -s -X POST {base}/v1/runs/run_demo/resume -H 'Authorization: Bearer {raw}'"
        )
        out.write(
            f"  Metrics:        curl -s {base}/metrics -H 'Authorization: Bearer {metrics.token()}'"
        )
        out.write(f"EAI_DEMO_AGENT_KEY={raw}")

    def _apply_mcp_tool(self, tenants, mcp_port: int) -> None:
        """kb.search lives on the demo MCP server, whose definition apply reads and pins:
        serve it for the time of the seed unless it already runs (`make run` serves it)."""
        started = None
        # A taken port: most likely the demo MCP server of a running `manage.py serve`.
        with contextlib.suppress(OSError):
            started = demo.McpUpstream(mcp_port)
        try:
            for tenant in tenants:
                apply_manifests(
                    tenant=tenant, documents=[demo.kb_search_manifest(mcp_port)], actor="demo"
                )
        except ManifestInvalid as exc:
            self.stderr.write(
                f"kb.search (MCP) not seeded: port {mcp_port} does not serve the demo MCP "
                f"server ({exc.errors[0]['message']})"
            )
        finally:
            if started is not None:
                started.stop()

    def _walk_demo_run(self, key) -> None:
        """The deterministic demo agent, walked once (later seeds leave it as it is):
        turn started → search → plan → transfer requested → authorization required.
        A reviewer approves it in the admin; `POST /v1/runs/run_demo/resume` then
        publishes the outcome."""
        with tenant_scope(key.tenant, readonly=True):
            if Run.objects.for_tenant(key.tenant).filter(run_id="run_demo").exists():
                return
        runs.start_run(key=key, run_id="run_demo", goal="Refund the customer of INC-42")
        pipeline.invoke(
            key=key,
            tool_name="jira.search",
            body={"input": {"q": "INC-42"}, "run_id": "run_demo", "step_index": 0},
            request=None,
        )
        with tenant_scope(key.tenant):
            audit.record(
                key.tenant,
                [],
                [
                    audit.AgentEvent(
                        "agent.plan.updated",
                        run_id="run_demo",
                        payload={
                            "steps": [
                                "read INC-42",
                                "transfer the refund (needs approval)",
                                "report the outcome",
                            ]
                        },
                    )
                ],
            )
        pipeline.invoke(
            key=key,
            tool_name="payments.transfer",
            body={
                "input": {
                    "iban": "FR7630006000011234567890189",
                    "amount": "120.00",
                    "currency": "EUR",
                    "reference": "Refund INC-42",
                },
                "run_id": "run_demo",
                "step_index": 1,
            },
            request=None,
        )
