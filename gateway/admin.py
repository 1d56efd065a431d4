"""Read-only admin views of the gateway's records. Tool output is untrusted data: the
admin shows it through Django's auto-escaping, never marked safe."""

from django.contrib import admin

from gateway.models import Decision, Invocation, ManifestVersion, PolicyModule, Tool


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
