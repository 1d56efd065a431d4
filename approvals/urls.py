"""Routes of `/v1/approvals`."""

from django.urls import path

from approvals import views

urlpatterns = [
    path("approvals", views.ApprovalListView.as_view()),
    path("approvals/<str:approval_id>/decision", views.ApprovalDecisionView.as_view()),
]
