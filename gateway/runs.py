"""Runs (agent turns) of the agent tool protocol: start, read, resume.

A run's id is chosen by the client (`run_…`, or any id of the allowed shape); an
unknown id on invoke creates the run too. `resume` re-reads the run after human
decisions and publishes the outcome: `agent.turn.completed` once nothing is pending.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db import IntegrityError

from gateway import audit, credentials, dlp
from gateway.models import ApprovalRequest, Event, Invocation, Run, new_id
from tenants.models import ApiKey
from tenants.scope import tenant_scope

RUNNING = "running"
WAITING = "waiting"
COMPLETED = "completed"


class RunExists(Exception):
    """The client chose a run id that already exists in this tenant."""


def start_run(*, key: ApiKey, run_id: str | None, goal: str = "") -> Run:
    """Create a run and publish `agent.turn.started`."""
    tenant = key.tenant
    run = Run(tenant=tenant, run_id=run_id or new_id("run"), agent=key.agent)
    try:
        with tenant_scope(tenant):
            run.save(force_insert=True)
            audit.record(
                tenant,
                [],
                [
                    audit.AgentEvent(
                        "agent.turn.started",
                        run_id=run.run_id,
                        payload={"agent": key.agent, "goal": _masked(tenant, goal)},
                    )
                ],
            )
    except IntegrityError as exc:
        raise RunExists(run.run_id) from exc
    return run


def _masked(tenant: Any, text: str) -> str:
    """A run's goal as the feed keeps it: an agent writes it freely, personal data and
    the tenant's credentials included. Masked whole, then bounded (a value cut first
    could show half of itself)."""
    return dlp.scrub_text(text, secrets=credentials.known_secrets(tenant))[0][:500]


def run_state(run: Run) -> dict[str, Any]:
    """The run as the API shows it: its status and its calls, oldest first."""
    tenant = run.tenant
    invocations = list(
        Invocation.objects.for_tenant(tenant).filter(run_id=run.run_id).order_by("id")
    )
    last = (
        Event.objects.for_tenant(tenant)
        .filter(run_id=run.run_id)
        .order_by("-sequence")
        .values_list("sequence", flat=True)
        .first()
    )
    counts = Counter(i.status for i in invocations)
    pending = [i.id for i in invocations if not i.is_final]
    # A call still pending says the run is not done, even one made into a run a resume
    # had completed before.
    if pending:
        status = WAITING if counts[Invocation.WAITING_APPROVAL] else RUNNING
    else:
        status = COMPLETED if run.status == COMPLETED else RUNNING
    return {
        "run_id": run.run_id,
        "status": status,
        "agent": run.agent or None,
        "created_at": run.created_at.isoformat(),
        "counts": dict(counts),
        "pending_invocations": pending,
        "invocations": [i.as_dict() for i in invocations],
        "last_sequence": last,
    }


def resume_run(*, key: ApiKey, run: Run) -> dict[str, Any]:
    """Publish what human decisions changed; complete the turn once nothing is pending.

    Completing is a conditional update, so two resumes publish `agent.turn.completed`
    once.
    """
    tenant = key.tenant
    with tenant_scope(tenant):
        state = run_state(run)
        if not state["pending_invocations"] and run.status != COMPLETED:
            changed = (
                Run.objects.for_tenant(tenant)
                .filter(pk=run.pk)
                .exclude(status=COMPLETED)
                .update(status=COMPLETED)
            )
            run.status = COMPLETED  # by this resume, or by one that raced it
            if changed:
                decided = list(
                    ApprovalRequest.objects.for_tenant(tenant)
                    .filter(invocation__run_id=run.run_id)
                    .values_list("id", "status")
                )
                audit.record(
                    tenant,
                    [],
                    [
                        audit.AgentEvent(
                            "agent.turn.completed",
                            run_id=run.run_id,
                            refs={"approvals": [a for a, _ in decided]},
                            payload={"counts": state["counts"]},
                        )
                    ],
                )
        return run_state(run)
