"""The admin portal's active tenant: staff work in one of their tenants at a time.

The session holds the tenant a staff user chose with the header's switcher; every admin
of tenant data derives from `TenantScopedAdmin`, which filters by that tenant and runs
its views inside `tenant_scope(...)`. That is the one place the admin is scoped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.contrib import admin
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.views.decorators.http import require_POST

from tenants.models import Membership, Tenant
from tenants.scope import tenant_scope

SESSION_KEY = "eai_active_tenant"


def tenants_for(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Tenant]:
    """The tenants `user` may enter in the admin: all for superusers, else their
    memberships', in membership order (the first is the default)."""
    if not user.is_authenticated or not user.is_staff or not user.is_active:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.order_by("slug")
    return Tenant.objects.filter(memberships__user=user).order_by("memberships__id")


def active_tenant(request: HttpRequest) -> Tenant | None:
    """The tenant the request works in: the session's choice while it is still allowed,
    else the user's first tenant. Memoized on the request."""
    if hasattr(request, "_eai_active_tenant"):
        return request._eai_active_tenant
    allowed = tenants_for(request.user)
    chosen = request.session.get(SESSION_KEY)
    tenant = None
    if chosen:
        # Re-checked on every request: a membership removed since the switch ends access.
        tenant = allowed.filter(pk=chosen).first()
    if tenant is None:
        tenant = allowed.first()
    request._eai_active_tenant = tenant
    return tenant


def is_tenant_admin(user: AbstractBaseUser | AnonymousUser, tenant: Tenant | None) -> bool:
    """Superusers, and members holding the tenant-admin role of `tenant`."""
    if not user.is_authenticated or not user.is_active or tenant is None:
        return False
    if user.is_superuser:
        return True
    return Membership.objects.filter(user=user, tenant=tenant, role=Membership.ROLE_ADMIN).exists()


@require_POST
def switch_tenant(request: HttpRequest) -> HttpResponse:
    """POST `tenant=<uuid>`: make it the active tenant. A tenant the user may not enter
    answers 404, like one that does not exist. Mounted behind `admin_site.admin_view`
    (staff login and CSRF)."""
    try:
        tenant_id = uuid.UUID(request.POST.get("tenant", ""))
    except ValueError as exc:
        raise Http404 from exc
    tenant = tenants_for(request.user).filter(pk=tenant_id).first()
    if tenant is None:
        raise Http404
    request.session[SESSION_KEY] = str(tenant.pk)
    # The index, not the page the form was on: that page may show the old tenant's row.
    return HttpResponseRedirect(reverse("admin:index"))


def portal_context(request: HttpRequest) -> dict[str, Any]:
    """Template context for the header's switcher (lazy: no query unless rendered)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff:
        return {}
    return {
        "portal_tenants": SimpleLazyObject(lambda: list(tenants_for(user))),
        "portal_active_tenant": SimpleLazyObject(lambda: active_tenant(request)),
    }


def _rendered(response: HttpResponse) -> HttpResponse:
    # Render inside the scope: a TemplateResponse would otherwise run its queries after
    # the view returned, outside the tenant's transaction.
    if isinstance(response, TemplateResponse) and not response.is_rendered:
        response.render()
    return response


class TenantScopedAdmin(admin.ModelAdmin):
    """A ModelAdmin over a model with a `tenant` FK, showing only the active tenant's rows.

    Rows of any other tenant do not exist here: their pages answer 404. Views run inside
    the tenant scope (row-level security on PostgreSQL).
    """

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        tenant = active_tenant(request)
        if tenant is None:
            # Staff of no tenant: nothing to show, and no scope to read in. unscoped()
            # only to say "none": none() never runs a query.
            return self.model.objects.unscoped().none()
        # Inside the view's scope the manager already holds the tenant's rows alone; the
        # filter says so where it is read.
        return super().get_queryset(request).filter(tenant=tenant)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None):
        # Django's admin redirects to the index for a missing object; another tenant's
        # row must instead answer exactly like a row that does not exist: 404.
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            raise Http404
        return obj

    def scope(self, request: HttpRequest) -> AbstractContextManager[None]:
        tenant = active_tenant(request)
        return nullcontext() if tenant is None else tenant_scope(tenant, readonly=True)

    def in_scope(self, request: HttpRequest, view: Callable[..., HttpResponse], *args: Any):
        with self.scope(request):
            return _rendered(view(request, *args))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        return self.in_scope(request, super().changelist_view, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self.in_scope(request, super().changeform_view, object_id, form_url, extra_context)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context=None):
        return self.in_scope(request, super().delete_view, object_id, extra_context)

    def history_view(self, request: HttpRequest, object_id: str, extra_context=None):
        return self.in_scope(request, super().history_view, object_id, extra_context)


class ReadOnlyTenantAdmin(TenantScopedAdmin):
    """Records nobody edits through the admin (logs, decisions, audit): view only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
