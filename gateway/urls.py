"""Routes of `/v1` (SPEC §4)."""

from django.urls import path

from gateway import views

urlpatterns = [
    # First: resolved on every MCP call, it need not be tried after every other route.
    path("mcp", views.mcp_view),
    path("tools", views.ToolListView.as_view()),
    path("tools/invocations", views.InvocationListView.as_view()),
    path("tools/invocations/<str:invocation_id>", views.InvocationDetailView.as_view()),
    path("tools/invocations/<str:invocation_id>/cancel", views.InvocationCancelView.as_view()),
    path("tools/<str:name>", views.ToolDetailView.as_view()),
    path("tools/<str:name>/invoke", views.InvokeView.as_view()),
    path("decisions/<str:decision_id>", views.DecisionView.as_view()),
    path("artifacts/<str:artifact_id>", views.ArtifactView.as_view()),
    path("contracts/<str:name>", views.ContractView.as_view()),
    path("contracts/<str:name>/validate", views.ContractValidateView.as_view()),
    path("manifests/apply", views.ManifestApplyView.as_view()),
    path("audit/events", views.AuditEventsView.as_view()),
    path("audit/verify", views.AuditVerifyView.as_view()),
    path("events", views.EventsView.as_view()),
    path("finops/usage", views.FinopsUsageView.as_view()),
    path("runs", views.RunsView.as_view()),
    path("runs/<str:run_id>", views.RunDetailView.as_view()),
    path("runs/<str:run_id>/resume", views.RunResumeView.as_view()),
]
