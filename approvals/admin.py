"""Reviewers' admin: the approvals queue (read-only until decisions land)."""

from django.contrib import admin

from gateway.admin import ReadOnlyTenantAdmin
from gateway.models import ApprovalRequest


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyTenantAdmin):
    list_display = ["id", "tool", "risk_class", "status", "tenant", "created_at", "expires_at"]
    list_filter = ["tenant", "status", "tool", "risk_class"]
    search_fields = ["id", "tool"]
