"""Admin for tenants and their staff memberships (API keys: gateway/admin.py)."""

from django.contrib import admin

from tenants.models import Membership, Tenant


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
