"""The gateway's records in the admin portal, all scoped to the active tenant.

Logs and decisions are read-only (audit rows are append-only here too). Tools are
read-only except for their `disabled` flag and their per-tool reviewer rights, which
tenant admins manage. Tool input and output are untrusted data: they are shown through
Django's escaping (`format_html` escapes its arguments), never marked safe.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from guardian.admin import (
    AdminGroupObjectPermissionsForm,
    AdminUserObjectPermissionsForm,
    GuardedModelAdminMixin,
)

from gateway import audit, pipeline
from gateway.credentials import delete_secret, set_secret
from gateway.keys import change_api_key, issue_api_key, revoke_api_key
from gateway.models import (
    AuditCheckpoint,
    AuditEvent,
    Decision,
    Event,
    Invocation,
    ManifestVersion,
    PolicyModule,
    StoredCredential,
    Tool,
    UsageEvent,
)
from tenants.models import ApiKey, Membership
from tenants.portal import ReadOnlyTenantAdmin, TenantScopedAdmin, active_tenant, is_tenant_admin
from tenants.scope import tenant_scope

REVIEW_CODENAME = "review_tool"


def pretty_json(value: Any) -> str:
    """JSON indented in a <pre>, escaped (the value is data from tools and agents)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return format_html('<pre class="eai-json">{}</pre>', text)


# ----------------------------------------------------------------------- tools


class _ReviewRightOnly:
    """Guardian's object-permission forms narrowed to the one right that matters here
    (`review_tool`), each change audited in the tool's tenant."""

    actor = "system"
    subject = ""

    def get_obj_perms_field_choices(self) -> list[tuple[str, str]]:
        return [(REVIEW_CODENAME, "Can decide approvals of this tool")]

    def save_obj_perms(self) -> None:
        before = REVIEW_CODENAME in set(self.get_obj_perms_field_initial())
        after = REVIEW_CODENAME in set(self.cleaned_data[self.get_obj_perms_field_name()])
        tool = self.obj
        with tenant_scope(tool.tenant):
            super().save_obj_perms()
            if before != after:
                action = "tool.reviewer.granted" if after else "tool.reviewer.revoked"
                payload = {"tool": tool.name, "subject": self.subject}
                audit.record(tool.tenant, [audit.Entry(action, self.actor, tool.name, payload)])


class ReviewRightUserForm(_ReviewRightOnly, AdminUserObjectPermissionsForm):
    def __init__(self, user: AbstractBaseUser, *args: Any, **kwargs: Any) -> None:
        super().__init__(user, *args, **kwargs)
        self.subject = f"user:{user.pk}"


class ReviewRightGroupForm(_ReviewRightOnly, AdminGroupObjectPermissionsForm):
    def __init__(self, group: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(group, *args, **kwargs)
        self.subject = f"group:{group.pk}"


@admin.register(Tool)
class ToolAdmin(GuardedModelAdminMixin, TenantScopedAdmin):
    """Read-only catalog entries; tenant admins (and superusers) may flip `disabled` and
    manage who reviews each tool (guardian's "Object permissions" page)."""

    change_form_template = "admin/gateway/tool/change_form.html"
    list_display = ["name", "version", "revision", "disabled", "drifted", "updated_at"]
    list_filter = ["disabled"]

    @admin.display(boolean=True, description="definition changed")
    def drifted(self, obj: Tool) -> bool:
        return bool(obj.mcp_drift)

    search_fields = ["name"]
    fields = [
        "name",
        "version",
        "revision",
        "disabled",
        "digest",
        "updated_at",
        "manifest_json",
        "mcp_definition_review",
        "history",
    ]
    readonly_fields = [
        "name",
        "version",
        "revision",
        "digest",
        "updated_at",
        "manifest_json",
        "mcp_definition_review",
        "history",
    ]

    @admin.display(description="MCP upstream definition")
    def mcp_definition_review(self, obj: Tool) -> str:
        """An `mcp` tool's reviewed upstream definition and pin; after a drift, the
        definition found beside it, for the review that applying the manifest again is.
        Escaped: the upstream's text is data (a changed description may hold markup)."""
        if not obj.mcp_pin:
            return format_html("{}", "-")
        if not obj.mcp_drift:
            return format_html(
                "<div>pin <code>{}</code></div>{}", obj.mcp_pin, pretty_json(obj.mcp_definition)
            )
        drift = obj.mcp_drift
        return format_html(
            '<p class="errornote">The definition changed on the MCP server (detected {}): '
            "the tool answers 503 until its manifest is applied again.</p>"
            '<table class="eai-drift"><tr><th>reviewed <code>{}</code></th>'
            "<th>found <code>{}</code></th></tr>"
            '<tr><td style="vertical-align:top">{}</td>'
            '<td style="vertical-align:top">{}</td></tr></table>',
            drift.get("detected_at", "?"),
            obj.mcp_pin,
            drift.get("digest", "?"),
            pretty_json(obj.mcp_definition),
            pretty_json(drift.get("definition")),
        )

    @admin.display(description="manifest")
    def manifest_json(self, obj: Tool) -> str:
        return pretty_json(obj.manifest)

    @admin.display(description="version history")
    def history(self, obj: Tool) -> str:
        versions = ManifestVersion.objects.for_tenant(obj.tenant).filter(kind="Tool", name=obj.name)
        rows = (
            (
                reverse("admin:gateway_manifestversion_change", args=[v.pk]),
                v.revision,
                v.version,
                v.applied_by or "-",
                v.created_at.isoformat(timespec="seconds"),
            )
            for v in versions.order_by("-revision")[:50]
        )
        return format_html_join(
            "", '<div><a href="{}">r{} ({})</a> by {} at {}</div>', rows
        ) or format_html("{}", "-")

    def _is_admin(self, request: HttpRequest) -> bool:
        return is_tenant_admin(request.user, active_tenant(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tools come from manifests (`POST /v1/manifests`), not from here

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._is_admin(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self._is_admin(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or self._is_admin(request)

    def render_change_form(self, request: HttpRequest, context: dict, *args: Any, **kw: Any):
        context["show_permissions_link"] = self._is_admin(request)
        return super().render_change_form(request, context, *args, **kw)

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        """Only `disabled` is editable: a conditional update and its audit entry."""
        if "disabled" not in form.changed_data:
            return
        with tenant_scope(obj.tenant):
            moved = (
                Tool.objects.for_tenant(obj.tenant)
                .filter(pk=obj.pk)
                .exclude(disabled=obj.disabled)
                .update(disabled=obj.disabled, updated_at=timezone.now())
            )
            if moved:
                pipeline.forget_cached_tools()  # .update() sends no post_save
                action = "tool.disabled" if obj.disabled else "tool.enabled"
                entry = audit.Entry(action, f"user:{request.user.pk}", obj.name, {"tool": obj.name})
                audit.record(obj.tenant, [entry])

    # Guardian's object-permission pages: tenant admins only (guardian checks
    # has_change_permission), inside the tenant scope, for the tenant's members only.

    def get_obj_perms_manage_user_form(self, request: HttpRequest) -> type:
        return type("ReviewRightUserForm", (ReviewRightUserForm,), {"actor": _actor(request)})

    def get_obj_perms_manage_group_form(self, request: HttpRequest) -> type:
        return type("ReviewRightGroupForm", (ReviewRightGroupForm,), {"actor": _actor(request)})

    def obj_perms_manage_view(self, request: HttpRequest, object_pk: str):
        return self.in_scope(request, super().obj_perms_manage_view, object_pk)

    def obj_perms_manage_user_view(self, request: HttpRequest, object_pk: str, user_id: str):
        tenant = active_tenant(request)
        # Rights are for the tenant's own staff; anyone else does not exist here.
        if tenant is None or not str(user_id).isdigit():
            raise Http404
        if not Membership.objects.filter(tenant=tenant, user_id=int(user_id)).exists():
            raise Http404
        return self.in_scope(request, super().obj_perms_manage_user_view, object_pk, user_id)

    def obj_perms_manage_group_view(self, request: HttpRequest, object_pk: str, group_id: str):
        return self.in_scope(request, super().obj_perms_manage_group_view, object_pk, group_id)


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.pk}"


@admin.register(ManifestVersion)
class ManifestVersionAdmin(ReadOnlyTenantAdmin):
    list_display = ["kind", "name", "version", "revision", "applied_by", "created_at"]
    list_filter = ["kind", "name"]
    search_fields = ["name"]
    fields = [
        "kind",
        "name",
        "version",
        "revision",
        "applied_by",
        "created_at",
        "digest",
        "diff_json",
        "manifest_json",
        "mcp_pin",
        "mcp_definition_json",
    ]
    readonly_fields = ["diff_json", "manifest_json", "mcp_definition_json"]

    @admin.display(description="MCP upstream definition reviewed with this version")
    def mcp_definition_json(self, obj: ManifestVersion) -> str:
        return pretty_json(obj.mcp_definition) if obj.mcp_pin else format_html("{}", "-")

    @admin.display(description="changes from the previous revision")
    def diff_json(self, obj: ManifestVersion) -> str:
        return pretty_json(obj.diff)

    @admin.display(description="manifest")
    def manifest_json(self, obj: ManifestVersion) -> str:
        return pretty_json(obj.manifest)


class BudgetExceededFilter(admin.SimpleListFilter):
    title = "policy budget"
    parameter_name = "budget"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("exceeded", "exceeded"), ("within", "within")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "exceeded":
            return queryset.filter(budget_exceeded_at__isnull=False)
        if self.value() == "within":
            return queryset.filter(budget_exceeded_at__isnull=True)
        return queryset


@admin.register(PolicyModule)
class PolicyModuleAdmin(ReadOnlyTenantAdmin):
    """A module whose decision went past the policy budget (SPEC §14) is flagged until
    a new version of it is applied; every call is still decided under the budget."""

    list_display = ["name", "version", "updated_at", "budget_state"]
    list_filter = [BudgetExceededFilter]
    search_fields = ["name"]
    fields = [
        "name",
        "version",
        "digest",
        "updated_at",
        "budget_state",
        "budget_exceeded_reason",
        "rego",
    ]
    readonly_fields = ["budget_state"]

    @admin.display(description="policy budget", ordering="budget_exceeded_at")
    def budget_state(self, obj: PolicyModule) -> str:
        if obj.budget_exceeded_at is None:
            return "within"
        when = timezone.localtime(obj.budget_exceeded_at).strftime("%Y-%m-%d %H:%M:%S %Z")
        return f"budget exceeded at {when}"


@admin.register(Decision)
class DecisionAdmin(ReadOnlyTenantAdmin):
    list_display = ["id", "tool", "allow", "policy_version", "agent", "created_at"]
    list_filter = ["allow", "tool"]
    search_fields = ["id", "tool", "agent"]
    fields = [
        "id",
        "action",
        "tool",
        "tool_version",
        "allow",
        "reasons_json",
        "obligations_json",
        "policy_version",
        "input_digest",
        "api_key_id",
        "agent",
        "created_at",
    ]
    readonly_fields = ["reasons_json", "obligations_json"]

    @admin.display(description="reasons")
    def reasons_json(self, obj: Decision) -> str:
        return pretty_json(obj.reasons)

    @admin.display(description="obligations")
    def obligations_json(self, obj: Decision) -> str:
        return pretty_json(obj.obligations)


@admin.register(Invocation)
class InvocationAdmin(ReadOnlyTenantAdmin):
    list_display = ["id", "tool", "status", "agent", "run_id", "created_at"]
    list_filter = ["status", "tool"]
    search_fields = ["id", "run_id", "agent"]
    # Never `sealed_input`: the encrypted raw input stays with the executor.
    fields = [
        "id",
        "tool",
        "tool_version",
        "status",
        "input_json",
        "output_json",
        "error_json",
        "redactions",
        "decision",
        "approval_id",
        "run_id",
        "step_index",
        "agent",
        "api_key_id",
        "request_id",
        "cost_amount",
        "cost_currency",
        "created_at",
        "started_at",
        "finished_at",
    ]
    readonly_fields = ["input_json", "output_json", "error_json"]

    @admin.display(description="input (masked)")
    def input_json(self, obj: Invocation) -> str:
        return pretty_json(obj.input)

    @admin.display(description="output")
    def output_json(self, obj: Invocation) -> str:
        return pretty_json(obj.output)

    @admin.display(description="error")
    def error_json(self, obj: Invocation) -> str:
        return pretty_json(obj.error)


@admin.register(Event)
class EventAdmin(ReadOnlyTenantAdmin):
    list_display = ["sequence", "type", "run_id", "invocation_id", "created_at"]
    list_filter = ["type"]
    search_fields = ["id", "run_id", "invocation_id"]
    ordering = ["-sequence"]
    fields = [
        "id",
        "sequence",
        "type",
        "run_id",
        "invocation_id",
        "refs_json",
        "payload_json",
        "created_at",
    ]
    readonly_fields = ["refs_json", "payload_json"]

    @admin.display(description="refs")
    def refs_json(self, obj: Event) -> str:
        return pretty_json(obj.refs)

    @admin.display(description="payload")
    def payload_json(self, obj: Event) -> str:
        return pretty_json(obj.payload)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyTenantAdmin):
    """The hash chain, read-only; the list shows the chain's verification."""

    list_display = ["seq", "action", "actor", "object_ref", "created_at"]
    list_filter = ["action"]
    search_fields = ["object_ref", "actor"]
    ordering = ["-seq"]
    fields = [
        "seq",
        "action",
        "actor",
        "object_ref",
        "created_at",
        "payload_json",
        "prev_hash",
        "hash",
    ]
    readonly_fields = ["payload_json"]

    @admin.display(description="payload")
    def payload_json(self, obj: AuditEvent) -> str:
        return pretty_json(audit.event_view(obj)["payload"])

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        tenant = active_tenant(request)
        # Recomputes the whole chain on each visit: the banner must reflect the rows as
        # they are now, not a cached verdict.
        with self.scope(request):
            chain = audit.verify_chain(tenant) if tenant is not None else None
        context = {**(extra_context or {}), "chain": chain, "coverage": audit.coverage_note()}
        return super().changelist_view(request, context)


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyTenantAdmin):
    list_display = ["seq", "head_hash", "key_id", "created_at"]


# ------------------------------------------------------------------------ keys


class ApiKeyForm(forms.ModelForm):
    def clean(self) -> dict[str, Any]:
        data = super().clean()
        user, tenant = data.get("user"), data.get("tenant")
        if user and tenant and not user.memberships.filter(tenant=tenant).exists():
            self.add_error("user", _("A key's user must be a staff member of its tenant."))
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys of the active tenant (superusers: all). The raw key is shown once, on add."""

    form = ApiKeyForm

    list_display = [
        "public_id",
        "tenant",
        "agent",
        "name",
        "created_at",
        "expires_at",
        "revoked_at",
    ]
    search_fields = ["key_id", "agent", "name"]
    # The digest is set from the key made on add, never typed, and not shown (a hash of
    # the secret has no use on this page).
    exclude = ["digest"]
    readonly_fields = ["key_id", "created_at", "revoked_at", "created_by"]
    actions = ["revoke"]

    def get_list_filter(self, request: HttpRequest) -> list[str]:
        # A filter by tenant lists every tenant: the platform's administrators only.
        return ["tenant"] if request.user.is_superuser else []

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request).select_related("tenant")
        if request.user.is_superuser:
            return qs
        tenant = active_tenant(request)
        return qs.none() if tenant is None else qs.filter(tenant=tenant)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            raise Http404  # another tenant's key does not exist here
        return obj

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        # A key never moves to another tenant, nor to another user: separation of duties
        # reads who holds the key that made a call (issue a new key instead).
        return [*fields, "tenant", "user"] if obj is not None else fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Calls, approvals and audit entries name their key: revoke it, never delete it.
        return False

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any):
        if db_field.name == "tenant" and not request.user.is_superuser:
            tenant = active_tenant(request)
            kwargs["queryset"] = db_field.related_model.objects.filter(
                pk=tenant.pk if tenant else None
            )
        if db_field.name == "user":
            # Staff of the active tenant only (never another tenant's, never guardian's
            # anonymous user); save_model checks the key's own tenant as well.
            tenant = active_tenant(request)
            staff = db_field.related_model.objects.filter(is_active=True, is_staff=True)
            if tenant is not None:
                staff = staff.filter(memberships__tenant=tenant)
            elif request.user.is_superuser:
                staff = staff.filter(memberships__isnull=False)
            else:  # no tenant: nobody's staff to offer
                staff = staff.none()
            kwargs["queryset"] = staff.distinct()
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        if change:
            change_api_key(key=obj, actor=f"user:{request.user.pk}")
            return

        key, raw = issue_api_key(
            actor=f"user:{request.user.pk}",
            tenant=obj.tenant,
            scopes=obj.scopes,
            agent=obj.agent,
            name=obj.name,
            user=obj.user,
            created_by=request.user,
            expires_at=obj.expires_at,
        )
        obj.pk = key.pk
        obj.key_id = key.key_id
        messages.warning(
            request, f"API key {key.public_id}: {raw} — copy it now, it will not be shown again."
        )

    # Revoking changes keys: only who may change them (a view right showed the action
    # too, and one request revoked every key of the tenant).
    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request, queryset):
        actor = f"user:{request.user.pk}"
        count = sum(revoke_api_key(key=key, actor=actor) for key in queryset)
        self.message_user(request, f"{count} key(s) revoked.")


class CredentialForm(forms.ModelForm):
    """The secret is write-only: typed in, stored encrypted, never shown back."""

    secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        strip=False,
        help_text="Stored encrypted; it is never displayed again. Type a new one to replace it.",
    )

    class Meta:
        model = StoredCredential
        fields = ["name"]


@admin.register(StoredCredential)
class StoredCredentialAdmin(TenantScopedAdmin):
    """The in-process credential store (used when OpenBao is not configured): tenant
    admins set secrets here; nobody can read one back."""

    form = CredentialForm
    list_display = ["name", "updated_at"]
    readonly_fields = ["updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["name", "updated_at"] if obj else ["updated_at"]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_tenant_admin(request.user, active_tenant(request))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_module_permission(request) and active_tenant(request) is not None

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def save_model(self, request: HttpRequest, obj: StoredCredential, form: Any, change: bool):
        tenant = active_tenant(request)
        name = obj.name if change else form.cleaned_data["name"]
        set_secret(
            tenant=tenant,
            name=name,
            secret=form.cleaned_data["secret"],
            actor=f"user:{request.user.pk}",
            via="admin",
        )
        saved = StoredCredential.objects.for_tenant(tenant).get(name=name)
        obj.pk, obj.tenant, obj.ciphertext = saved.pk, tenant, saved.ciphertext

    def delete_model(self, request: HttpRequest, obj: StoredCredential) -> None:
        delete_secret(
            tenant=obj.tenant, name=obj.name, actor=f"user:{request.user.pk}", via="admin"
        )

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        # The bulk action: one transaction, one audit entry per credential deleted.
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyTenantAdmin):
    list_display = [
        "occurred_at",
        "unit",
        "quantity",
        "amount",
        "currency",
        "tool",
        "agent",
        "run_id",
    ]
    list_filter = ["unit", "tool", "currency"]
    search_fields = ["tool", "agent", "run_id", "invocation_id"]
    date_hierarchy = "occurred_at"
