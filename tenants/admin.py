"""Admin for tenants, memberships and API keys. A key's secret is shown exactly once."""

from django.contrib import admin, messages

from tenants.keys import issue_api_key, revoke_api_key
from tenants.models import ApiKey, Membership, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(memberships__user=request.user)


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
        count = sum(revoke_api_key(key=key) for key in queryset)
        self.message_user(request, f"{count} key(s) revoked.")
