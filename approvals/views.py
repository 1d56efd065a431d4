"""`/v1/approvals`: the API side of reviewing (the admin is the main place for it).

Deciding needs a key issued to a staff user who belongs to the tenant, holds the
tool's reviewer right, and did not make the call. Agent keys can never decide.
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from approvals.decisions import decide, visible_approvals
from eai.errors import ApiError, Text
from gateway.models import ApprovalRequest
from gateway.views import LIST_PARAMS, TenantAPIView, api_doc, json_body, page, query_limit


def approval_view(approval: ApprovalRequest) -> dict[str, Any]:
    invocation = approval.invocation
    return {
        "approval_id": approval.id,
        "status": approval.status,
        "tool": approval.tool,
        "risk_class": approval.risk_class,
        "invocation_id": approval.invocation_id,
        "decision_id": approval.decision_id,
        "policy_version": approval.policy_version,
        "input_digest": approval.input_digest,
        "input": invocation.input,
        "agent": invocation.agent or None,
        "run_id": invocation.run_id or None,
        "min_approvers": approval.min_approvers,
        "decisions": [
            {
                "verdict": d.verdict,
                "reason": d.reason,
                "reviewer": d.reviewer.get_username(),
                "created_at": d.created_at.isoformat(),
            }
            for d in approval.decisions.all()
        ],
        "created_at": approval.created_at.isoformat(),
        "expires_at": approval.expires_at.isoformat(),
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
    }


class ApprovalListView(TenantAPIView):
    required_scopes = {"GET": "approvals:read"}

    @api_doc(
        "Approvals: a reviewer's key sees its tools' approvals, an agent's key its own",
        params=[*LIST_PARAMS, OpenApiParameter("status", str), OpenApiParameter("tool", str)],
    )
    def get(self, request: Request) -> Response:
        key = request.auth
        limit = query_limit(request)
        params = request.query_params
        cursor = params.get("cursor")
        if cursor is not None and not (cursor.startswith("apr_") and len(cursor) <= 40):
            raise ApiError("invalid_cursor")  # as the invocations list answers
        status = params.get("status")
        if status and status not in ApprovalRequest.STATUSES:
            raise ApiError(
                "invalid_request",
                reason=Text(_("unknown status '%(value)s'"), value=status[:50]),
                details={"field": "status", "allowed": ApprovalRequest.STATUSES},
            )
        if key.user_id:
            rows = visible_approvals(key.user, self.tenant)
        else:
            rows = ApprovalRequest.objects.filter(requested_by_key=key.public_id)
        for field in ("status", "tool"):
            if params.get(field):
                rows = rows.filter(**{field: params[field]})
        if cursor:
            rows = rows.filter(id__lt=cursor)
        rows = list(
            rows.select_related("invocation")
            .prefetch_related("decisions__reviewer")
            .order_by("-id")[: limit + 1]
        )
        return Response(page(rows, limit, lambda a: a.id, approval_view))


class ApprovalDecisionView(TenantAPIView):
    required_scopes = {"POST": "approvals:decide"}

    @api_doc('Decide: {"verdict": "approve"|"deny", "reason": "…"}', request=OpenApiTypes.OBJECT)
    def post(self, request: Request, approval_id: str) -> Response:
        key = request.auth
        body = json_body(request)
        if not isinstance(body, dict) or set(body) - {"verdict", "reason"}:
            raise ApiError(
                "invalid_request", reason=Text(_("the body may hold only verdict and reason"))
            )
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ApiError("reason_required")
        if key.user_id is None or not key.user.is_staff or not key.user.is_active:
            raise ApiError("reviewer_required")
        if key.created_by_id not in (None, key.user_id):
            # Whoever issued a key saw its secret: a key a tenant admin issued to a
            # reviewer could decide in the reviewer's name. Deciding needs a key of
            # one's own (or one the platform issued, with no staff creator).
            raise ApiError("reviewer_required")
        approval = decide(
            tenant=self.tenant,
            approval_id=approval_id,
            reviewer=key.user,
            verdict=body.get("verdict"),
            reason=reason or "",
            via="api",
        )
        approval = ApprovalRequest.objects.select_related("invocation").get(pk=approval.pk)
        return Response(approval_view(approval))
