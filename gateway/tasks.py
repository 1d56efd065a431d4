"""Celery tasks of the gateway. Each takes ids, is idempotent, and claims its work
with a conditional update, so a redelivered message changes nothing. Each enters the
tenant's scope itself (tenant by tenant for the sweeps): nothing of a tenant's is read
outside it."""

from __future__ import annotations

from celery import shared_task

from gateway import finops, pipeline
from gateway.audit import write_checkpoint
from tenants.models import Tenant
from tenants.scope import tenant_scope, tenant_session


@shared_task(name="gateway.tasks.execute_invocation", acks_late=True)
def execute_invocation(invocation_id: str, tenant_id: str) -> str | None:
    """Run a queued invocation (only a `queued` one: the claim is conditional)."""
    tenant = Tenant.objects.filter(pk=tenant_id).first()
    if tenant is None:
        return None
    with tenant_session(tenant):
        return pipeline.execute_queued(invocation_id, tenant)


@shared_task(name="gateway.tasks.write_checkpoints")
def write_checkpoints() -> int:
    """Sign every tenant's audit head (skipped where it is already checkpointed)."""
    written = 0
    for tenant in Tenant.objects.filter(is_active=True):
        with tenant_scope(tenant):
            written += write_checkpoint(tenant) is not None
    return written


@shared_task(name="gateway.tasks.deliver_usage")
def deliver_usage() -> int:
    """Post the usage outbox to EAI_FINOPS_URL (each row marked delivered once)."""
    return finops.deliver_outbox()


@shared_task(name="gateway.tasks.purge_idempotency")
def purge_idempotency() -> int:
    """Forget Idempotency-Keys older than 24 hours, tenant by tenant."""
    purged = 0
    for tenant in Tenant.objects.filter(is_active=True):
        with tenant_session(tenant):
            purged += pipeline.purge_idempotency_records(tenant)
    return purged


@shared_task(name="gateway.tasks.recover_stuck")
def recover_stuck() -> int:
    """Settle calls a dead process left `running` (see pipeline.recover_stuck)."""
    moved = 0
    for tenant in Tenant.objects.filter(is_active=True):
        with tenant_session(tenant):
            moved += pipeline.recover_stuck(tenant)
    return moved


@shared_task(name="gateway.tasks.mcp_resync")
def mcp_resync() -> int:
    """Read every mcp tool's upstream definition again; count the tools that drifted."""
    from gateway import mcp_sync

    return sum(c.outcome == "drift" for _slug, c in mcp_sync.resync_all())
