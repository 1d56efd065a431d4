"""Top-level routes: the admin portal, the `/v1` API, docs, health."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from gateway import views as gateway_views
from tenants import portal

urlpatterns = [
    # The header's active-tenant switcher; admin_view requires staff login and CSRF.
    path(
        "admin/switch-tenant/",
        admin.site.admin_view(portal.switch_tenant),
        name="admin_switch_tenant",
    ),
    path("admin/", admin.site.urls),
    path("v1/", include("gateway.urls")),
    path("v1/", include("approvals.urls")),
    # GET and HEAD only: OPTIONS on the docs page rendered a template that is not there
    # (a 500); other methods answer 405 with the envelope.
    path(
        "v1/openapi.json",
        SpectacularJSONAPIView.as_view(http_method_names=["get", "head"]),
        name="openapi",
    ),
    path(
        "v1/docs",
        SpectacularSwaggerView.as_view(url_name="openapi", http_method_names=["get", "head"]),
        name="docs",
    ),
    path("metrics", gateway_views.metrics_view),
    path("healthz", gateway_views.healthz),
    path("readyz", gateway_views.readyz),
]

handler400 = "eai.errors.handler400"
handler404 = "eai.errors.handler404"
handler500 = "eai.errors.handler500"
