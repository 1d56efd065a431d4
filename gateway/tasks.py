"""Celery tasks of the gateway. Each takes ids, is idempotent, and claims its work
with a conditional update, so a redelivered message changes nothing."""

from __future__ import annotations

from celery import shared_task

from gateway import pipeline
from tenants.models import Tenant


@shared_task(name="gateway.tasks.execute_invocation", acks_late=True)
def execute_invocation(invocation_id: str, tenant_id: str) -> str | None:
    """Run a queued invocation (only a `queued` one: the claim is conditional)."""
    tenant = Tenant.objects.filter(pk=tenant_id).first()
    if tenant is None:
        return None
    return pipeline.execute_queued(invocation_id, tenant)
