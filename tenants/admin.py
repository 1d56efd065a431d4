"""Admin for tenants and their staff memberships (API keys: gateway/admin.py), and the
admin site's own settings: its titles and the login form with the failed-login limit."""

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

# Imported for its signal receivers as well: failed logins are counted from startup,
# since the admin modules are loaded by Django's admin autodiscovery.
from tenants.lockout import LockoutAdminLoginForm
from tenants.models import Membership, Tenant

admin.site.site_header = "EAI Tool Gateway"
admin.site.site_title = "EAI Tool Gateway"
admin.site.index_title = "Compliance portal"
admin.site.login_form = LockoutAdminLoginForm


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(memberships__user=request.user)
