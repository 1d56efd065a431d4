"""Read-only admin views of the gateway's records. Tool output is untrusted data: the
admin shows it through Django's auto-escaping, never marked safe."""

from django.contrib import admin, messages

from gateway.keys import issue_api_key, revoke_api_key
from gateway.models import Decision, Invocation, ManifestVersion, PolicyModule, Tool
from tenants.models import ApiKey


class ReadOnlyTenantAdmin(admin.ModelAdmin):
    """Staff see only their tenants' rows and change nothing here."""

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(tenant__memberships__user=request.user)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Tool)
class ToolAdmin(ReadOnlyTenantAdmin):
    list_display = ["name", "version", "revision", "tenant", "disabled", "updated_at"]
    list_filter = ["tenant", "disabled"]
    search_fields = ["name"]


@admin.register(ManifestVersion)
class ManifestVersionAdmin(ReadOnlyTenantAdmin):
    list_display = ["kind", "name", "version", "revision", "tenant", "applied_by", "created_at"]
    list_filter = ["tenant", "kind"]
    search_fields = ["name"]


@admin.register(PolicyModule)
class PolicyModuleAdmin(ReadOnlyTenantAdmin):
    list_display = ["name", "version", "tenant", "updated_at"]


@admin.register(Decision)
class DecisionAdmin(ReadOnlyTenantAdmin):
    list_display = ["id", "tool", "allow", "policy_version", "agent", "tenant", "created_at"]
    list_filter = ["tenant", "allow", "tool"]
    search_fields = ["id", "tool", "agent"]


@admin.register(Invocation)
class InvocationAdmin(ReadOnlyTenantAdmin):
    list_display = ["id", "tool", "status", "agent", "run_id", "tenant", "created_at"]
    list_filter = ["tenant", "status", "tool"]
    search_fields = ["id", "run_id", "agent"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "public_id",
        "tenant",
        "agent",
        "name",
        "created_at",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    search_fields = ["key_id", "agent", "name"]
    readonly_fields = ["key_id", "digest", "created_at", "revoked_at", "created_by"]
    actions = ["revoke"]

    def get_queryset(self, request):
        qs = super().get_queryset(request).select_related("tenant")
        if request.user.is_superuser:
            return qs
        return qs.filter(tenant__memberships__user=request.user)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
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

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        actor = f"user:{request.user.pk}"
        count = sum(revoke_api_key(key=key, actor=actor) for key in queryset)
        self.message_user(request, f"{count} key(s) revoked.")
