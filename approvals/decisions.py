"""Reviewers' decisions on parked calls, and their expiry.

Every transition is a conditional update on the approval and on its invocation
(`filter(status=pending).update(...)`), inside a transaction that also writes the audit
entry and the feed event: two reviewers clicking at once, or a click racing the expiry
sweeper, change the state once.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError
from django.db.models import Q, QuerySet
from django.utils import timezone
from guardian.shortcuts import get_objects_for_user

from approvals.models import ApprovalDecision
from eai.errors import ApiError
from gateway import audit, credentials, dlp, metrics, pipeline
from gateway.models import ApprovalRequest, Invocation, Tool
from tenants.models import ApiKey, Membership, Tenant
from tenants.scope import tenant_scope, tenant_session

REVIEW_PERMISSION = "gateway.review_tool"
MAX_REASON = 2000


def is_member(user: AbstractBaseUser, tenant: Tenant) -> bool:
    return Membership.objects.filter(user=user, tenant=tenant).exists()


def reviewable_tools(user: AbstractBaseUser, tenant: Tenant) -> QuerySet:
    """The tenant's tools this user may decide on (django-guardian object permission)."""
    if not user.is_active or not is_member(user, tenant):
        return Tool.objects.none()
    return get_objects_for_user(
        user, REVIEW_PERMISSION, klass=Tool.objects.for_tenant(tenant), accept_global_perms=False
    )


def visible_approvals(user: AbstractBaseUser, tenant: Tenant) -> QuerySet:
    """Approvals of the tools this reviewer holds the right on (others do not exist)."""
    names = reviewable_tools(user, tenant).values_list("name", flat=True)
    return ApprovalRequest.objects.for_tenant(tenant).filter(tool__in=list(names))


def is_requester(user: AbstractBaseUser, approval: ApprovalRequest) -> bool:
    """Separation of duties: the call was made with a key this user owned or created
    when the call was made (recorded then), or owns or created now."""
    if user.pk in (approval.requested_by_users or []):
        return True
    key_id = approval.requested_by_key.removeprefix("key_")
    return ApiKey.objects.filter(key_id=key_id).filter(Q(user=user) | Q(created_by=user)).exists()


def decide(
    *,
    tenant: Tenant,
    approval_id: str,
    reviewer: AbstractBaseUser,
    verdict: str,
    reason: str,
    via: str = "admin",
) -> ApprovalRequest:
    """Record `reviewer`'s verdict; settle the approval when it is decided.

    Raises ApiError: not_found (unknown, or no right on the tool), invalid_request (no
    reason, bad verdict), separation_of_duties, already_decided, invalid_state (no
    longer pending; expired included).
    """
    if verdict not in (ApprovalDecision.APPROVE, ApprovalDecision.DENY):
        raise ApiError("invalid_verdict")
    reason = (reason or "").strip()
    if not reason:
        raise ApiError("reason_required")
    if len(reason) > MAX_REASON:
        raise ApiError("reason_too_long", limit=MAX_REASON)
    actor = f"user:{reviewer.pk}"
    expired = False
    with tenant_scope(tenant):
        # A reviewer's words are kept (the API, the audit chain): personal data they
        # quote from the call is masked as the call's own input is.
        reason = dlp.scrub_text(reason, secrets=credentials.known_secrets(tenant))[0]
        approval = (
            visible_approvals(reviewer, tenant)
            .select_for_update()
            .select_related("invocation")
            .filter(id=approval_id)
            .first()
        )
        if approval is None:
            raise ApiError("not_found")
        if is_requester(reviewer, approval):
            raise ApiError("separation_of_duties")
        if approval.status == ApprovalRequest.PENDING and approval.expires_at <= timezone.now():
            # Settle the expiry now (committed), then refuse the late verdict below.
            _expire(tenant, approval)
            expired = True
        elif approval.status != ApprovalRequest.PENDING:
            raise ApiError("approval_closed", current=approval.status)
        if not expired:
            _record_verdict(tenant, approval, reviewer, verdict, reason, via, actor)
            # In the tenant's scope: outside it, row-level security hides the row (on
            # PostgreSQL as the app role, the committed decision then answered 500).
            approval.refresh_from_db()
    if expired:
        raise ApiError("approval_closed", current=ApprovalRequest.EXPIRED)
    return approval


def _record_verdict(
    tenant: Tenant,
    approval: ApprovalRequest,
    reviewer: AbstractBaseUser,
    verdict: str,
    reason: str,
    via: str,
    actor: str,
) -> None:
    """Store one reviewer's verdict; settle the approval once it is decided."""
    try:
        ApprovalDecision.objects.create(
            tenant=tenant,
            approval=approval,
            reviewer=reviewer,
            verdict=verdict,
            reason=reason,
            via=via,
        )
    except IntegrityError as exc:
        raise ApiError("already_decided") from exc
    entries = [
        audit.Entry(
            "approval.decided",
            actor,
            approval.id,
            {
                "approval_id": approval.id,
                "invocation_id": approval.invocation_id,
                "verdict": verdict,
                "reason": reason[:500],
                "via": via,
            },
        )
    ]
    invocation = approval.invocation
    approvals = ApprovalDecision.objects.filter(
        approval=approval, verdict=ApprovalDecision.APPROVE
    ).count()
    if verdict == ApprovalDecision.DENY:
        _settle(tenant, approval, ApprovalRequest.DENIED, Invocation.DENIED, entries, actor)
    elif approvals >= approval.min_approvers:
        if _settle(tenant, approval, ApprovalRequest.APPROVED, Invocation.QUEUED, entries, actor):
            pipeline.enqueue_execution(invocation.id, tenant)
    else:
        audit.record(tenant, entries)


def _settle(
    tenant: Tenant,
    approval: ApprovalRequest,
    approval_status: str,
    invocation_status: str,
    entries: list[audit.Entry],
    actor: str,
) -> bool:
    """Move a pending approval and its waiting invocation on, once. Returns whether this
    call made the move."""
    now = timezone.now()
    moved = (
        ApprovalRequest.objects.for_tenant(tenant)
        .filter(pk=approval.pk, status=ApprovalRequest.PENDING)
        .update(status=approval_status, decided_at=now)
    )
    if not moved:
        audit.record(tenant, entries)
        return False
    fields: dict[str, Any] = {"status": invocation_status}
    if invocation_status != Invocation.QUEUED:
        error = {"code": "approval_denied", "message": "The approval was denied."}
        if invocation_status == Invocation.EXPIRED:
            error = {"code": "approval_expired", "message": "The approval expired."}
        fields.update(finished_at=now, error=error, sealed_input=None)
    Invocation.objects.for_tenant(tenant).filter(
        pk=approval.invocation_id, status=Invocation.WAITING_APPROVAL
    ).update(**fields)
    invocation = Invocation.objects.for_tenant(tenant).get(pk=approval.invocation_id)
    verdict = {"approved": "approve", "denied": "deny", "expired": "expire"}[approval_status]
    events = [
        audit.AgentEvent(
            "agent.authorization.decided",
            run_id=invocation.run_id,
            invocation_id=invocation.id,
            refs={"approval_id": approval.id, "decision_id": invocation.decision_id},
            payload={"tool": invocation.tool, "verdict": verdict, "status": invocation.status},
        )
    ]
    if invocation.is_final:
        entries.append(pipeline.invoke_entry(invocation))
        events.append(pipeline.agent_event("agent.error", invocation))
        metrics.observe_settled(invocation)
    audit.record(tenant, entries, events)
    return True


def _expire(tenant: Tenant, approval: ApprovalRequest) -> bool:
    entry = audit.Entry(
        "approval.expired",
        "system",
        approval.id,
        {"approval_id": approval.id, "invocation_id": approval.invocation_id},
    )
    return _settle(tenant, approval, ApprovalRequest.EXPIRED, Invocation.EXPIRED, [entry], "system")


def expire_due(tenant: Tenant) -> int:
    """Expire this tenant's pending approvals whose deadline passed. Idempotent."""
    count = 0
    now = timezone.now()
    with tenant_scope(tenant, readonly=True):
        due = list(
            ApprovalRequest.objects.for_tenant(tenant)
            .filter(status=ApprovalRequest.PENDING, expires_at__lte=now)
            .values_list("id", flat=True)[:500]
        )
    for approval_id in due:
        with tenant_scope(tenant):
            approval = (
                ApprovalRequest.objects.for_tenant(tenant)
                .select_for_update()
                .filter(id=approval_id, status=ApprovalRequest.PENDING)
                .first()
            )
            if approval is not None and _expire(tenant, approval):
                count += 1
    return count


def expire_all() -> int:
    """The sweeper: every tenant, one by one (each in its own tenant scope)."""
    expired = 0
    for tenant in Tenant.objects.filter(is_active=True):
        with tenant_session(tenant):
            expired += expire_due(tenant)
    return expired
