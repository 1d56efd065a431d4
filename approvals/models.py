"""The reviewers' side of approvals: one row per reviewer's verdict.

The request row (`gateway.ApprovalRequest`) is written by the pipeline when it parks a
call; reviewers' verdicts live here, and per-tool reviewer rights are django-guardian
object permissions `gateway.review_tool` on the tool.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from gateway.models import ApprovalRequest, TenantOwned
from tenants.models import Tenant


class ApprovalDecision(TenantOwned):
    APPROVE = "approve"
    DENY = "deny"
    VERDICTS = [(APPROVE, "Approve"), (DENY, "Deny")]

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    approval = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="decisions"
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    verdict = models.CharField(max_length=10, choices=VERDICTS)
    reason = models.TextField()
    via = models.CharField(max_length=10, default="admin")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            # Distinct reviewers: one verdict per person per approval.
            models.UniqueConstraint(fields=["approval", "reviewer"], name="uniq_reviewer_verdict")
        ]

    def __str__(self) -> str:
        return f"{self.approval_id}: {self.verdict} by {self.reviewer}"
