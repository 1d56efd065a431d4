"""Reviewers' admin: the approvals queue of the active tenant and one approval's page,
where a reviewer holding the tool's right approves or denies with a reason.

A reviewer sees only approvals of tools they hold `gateway.review_tool` on
(`visible_approvals`); any other approval answers 404. Deciding goes through
`approvals.decisions.decide`, which enforces rights, reasons and separation of duties.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince

from approvals.decisions import decide, is_requester, visible_approvals
from eai.errors import ApiError, render_message
from gateway.models import ApprovalRequest, Event
from tenants.portal import ReadOnlyTenantAdmin, active_tenant

STATUSES = [
    ApprovalRequest.PENDING,
    ApprovalRequest.APPROVED,
    ApprovalRequest.DENIED,
    ApprovalRequest.EXPIRED,
    ApprovalRequest.CANCELLED,
]
MAX_RUN_EVENTS = 200


def as_json(value: Any) -> str:
    """Indented JSON text, for the template to show escaped in a <pre>."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def language(request: HttpRequest) -> str:
    """'fr' or 'en': the language LocaleMiddleware chose for this request."""
    code = (getattr(request, "LANGUAGE_CODE", "") or "en")[:2].lower()
    return code if code in ("en", "fr") else "en"


def describe_redaction(redaction: Any) -> str:
    """'IBAN ×1 (input)' for a DLP redaction record; anything else as text."""
    if isinstance(redaction, dict) and "entity" in redaction:
        where = f" ({redaction['where']})" if redaction.get("where") else ""
        return f"{redaction['entity']} ×{redaction.get('count', 1)}{where}"
    return str(redaction)


class StatusFilter(admin.SimpleListFilter):
    """Status, pending by default: the queue opens on what is waiting."""

    title = "status"
    parameter_name = "status"
    ALL = "all"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in STATUSES] + [(self.ALL, "all")]

    def current(self) -> str:
        return self.value() or ApprovalRequest.PENDING

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.current()
        return queryset if value == self.ALL else queryset.filter(status=value)

    def choices(self, changelist: Any):
        # Django's default adds an "All" entry meaning "no parameter"; here no parameter
        # means pending, so "all" is an explicit value instead.
        counts = self.get_facet_queryset(changelist) if changelist.add_facets else None
        for i, (lookup, title) in enumerate(self.lookup_choices):
            if counts is not None:
                title = f"{title} ({counts[f'{i}__c']})"
            yield {
                "selected": self.current() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


class AgeFilter(admin.SimpleListFilter):
    """How long a call has been waiting."""

    title = "age"
    parameter_name = "age"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("lt1h", "< 1 hour"), ("1h-24h", "1–24 hours"), ("gt24h", "> 24 hours")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        now = timezone.now()
        hour, day = now - timedelta(hours=1), now - timedelta(hours=24)
        match self.value():
            case "lt1h":
                return queryset.filter(created_at__gt=hour)
            case "1h-24h":
                return queryset.filter(created_at__lte=hour, created_at__gt=day)
            case "gt24h":
                return queryset.filter(created_at__lte=day)
        return queryset


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyTenantAdmin):
    list_display = ["id", "tool", "risk_class", "status", "agent", "run", "age", "expires_at"]
    list_filter = [StatusFilter, "tool", "risk_class", AgeFilter]
    list_select_related = ["invocation"]
    search_fields = ["id", "tool", "invocation__run_id", "invocation__agent"]
    show_facets = admin.ShowFacets.ALWAYS
    review_template = "admin/approvals/approvalrequest/review.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        tenant = active_tenant(request)
        if tenant is None or request.user.is_superuser:
            return qs
        # Approvals of tools without the reviewer's right do not exist for them.
        return qs.filter(pk__in=visible_approvals(request.user, tenant).values("pk"))

    @admin.display(description="agent", ordering="invocation__agent")
    def agent(self, obj: ApprovalRequest) -> str:
        return obj.invocation.agent

    @admin.display(description="run", ordering="invocation__run_id")
    def run(self, obj: ApprovalRequest) -> str:
        return obj.invocation.run_id

    @admin.display(description="age", ordering="-created_at")
    def age(self, obj: ApprovalRequest) -> str:
        return timesince(obj.created_at)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        """The approval's page: GET shows it, POST records a verdict (CSRF-protected by
        the admin site) and redirects back."""
        with self.scope(request):
            approval = self.get_object(request, unquote(object_id))  # 404 if not visible
            if not self.has_view_permission(request, approval):
                raise PermissionDenied
            if request.method == "POST":
                return self._decide(request, approval)
            response = TemplateResponse(
                request, self.review_template, self._review_context(request, approval)
            )
            return response.render()

    def _decide(self, request: HttpRequest, approval: ApprovalRequest) -> HttpResponse:
        verdict = request.POST.get("verdict", "")
        try:
            decided = decide(
                tenant=approval.tenant,
                approval_id=approval.id,
                reviewer=request.user,
                verdict=verdict,
                reason=request.POST.get("reason", ""),
                via="admin",
            )
        except ApiError as err:
            messages.error(request, render_message(err.code, err.params, language(request)))
        else:
            done = "Approved" if verdict == "approve" else "Denied"
            messages.success(request, f"{done}: {decided.id} is now {decided.status}.")
        return HttpResponseRedirect(request.path)

    def _review_context(self, request: HttpRequest, approval: ApprovalRequest) -> dict[str, Any]:
        invocation = approval.invocation
        decision = approval.decision
        events = Event.objects.for_tenant(approval.tenant)
        if invocation.run_id:
            events = events.filter(run_id=invocation.run_id)
        else:
            events = events.filter(invocation_id=invocation.id)
        # The run as it stands now, its latest events if it is long.
        run_events = list(events.order_by("-sequence")[:MAX_RUN_EVENTS])[::-1]
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Approval {approval.id}",
            "subtitle": approval.tool,
            "approval": approval,
            "invocation": invocation,
            "input_json": as_json(invocation.input),
            "redactions": [describe_redaction(r) for r in invocation.redactions or []],
            "output_json": as_json(invocation.output) if invocation.output is not None else "",
            "error_json": as_json(invocation.error) if invocation.error else "",
            "decision": decision,
            "decision_result": "allow" if decision.allow else "deny",
            "reasons_json": as_json(decision.reasons),
            "obligations_json": as_json(decision.obligations),
            "run_events": [(e, as_json(e.payload)) for e in run_events],
            "verdicts": approval.decisions.select_related("reviewer"),
            "is_pending": approval.status == ApprovalRequest.PENDING,
            "is_requester": is_requester(request.user, approval),
            "queue_url": reverse("admin:gateway_approvalrequest_changelist"),
        }
