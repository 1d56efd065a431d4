"""A NUL character (`%00`) in a path id or a query filter is refused as an unknown
value is (404 for an id, 400 for a filter), never a 500: PostgreSQL's text cannot
hold one, and each such request raised there with a traceback. Run on PostgreSQL with
EAI_DATABASE_URL set (where it matters); SQLite must answer the same."""

from __future__ import annotations

import logging

import pytest

from .conftest import error_of

IDS = [
    ("get", "/v1/tools/a%00b"),
    ("post", "/v1/tools/a%00b/invoke"),
    ("post", "/v1/tools/jira.search%00/invoke"),
    ("get", "/v1/tools/invocations/tinv_%00"),
    ("post", "/v1/tools/invocations/tinv_%00/cancel"),
    ("get", "/v1/decisions/dec_%00"),
    ("get", "/v1/artifacts/art_%00"),
    ("get", "/v1/contracts/tool-manifest%00"),
    ("post", "/v1/contracts/tool-manifest%00/validate"),
    ("get", "/v1/runs/run%00"),
    ("post", "/v1/runs/run%00/resume"),
    ("post", "/v1/approvals/apr_%00/decision"),
    ("get", "/%00"),
]

FILTERS = [
    "/v1/tools?cursor=%00",
    "/v1/tools/invocations?tool=%00",
    "/v1/tools/invocations?run_id=a%00",
    "/v1/tools/invocations?agent=%00",
    "/v1/tools/invocations?status=%00",
    "/v1/tools/invocations?cursor=tinv_%00",
    "/v1/tools/invocations/tinv_x?wait=%00",
    "/v1/audit/events?action=%00",
    "/v1/audit/events?cursor=%00",
    "/v1/events?run_id=%00",
    "/v1/events?cursor=%00",
    "/v1/finops/usage?group_by=%00",
    "/v1/finops/usage?from=%00",
    "/v1/approvals?tool=%00",
    "/v1/approvals?status=%00",
    "/v1/approvals?cursor=apr_%00",
    "/v1/tools?%00=1",
]


@pytest.fixture
def no_server_errors(caplog):
    caplog.set_level(logging.ERROR)
    yield
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("method, path", IDS)
def test_it_answers_404_for_a_nul_in_an_id(alice, bob, method, path, no_server_errors):
    api = alice
    api.client.raise_request_exception = False
    if method == "get":
        response = api.client.get(path, headers=api._headers(None))
    else:
        response = api.client.post(
            path, data="{}", content_type="application/json", headers=api._headers(None)
        )
    assert response.status_code == 404, (path, response.content)
    assert error_of(response)["code"] == "not_found"
    # Bob's tenant is unaffected: the same route answers him normally.
    assert bob.get("/v1/tools").status_code == 200


@pytest.mark.parametrize("path", FILTERS)
def test_it_answers_400_for_a_nul_in_a_filter(alice, path, no_server_errors):
    alice.client.raise_request_exception = False
    response = alice.client.get(path, headers=alice._headers({"Accept-Language": "fr"}))
    assert response.status_code == 400, (path, response.content)
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert error["message_i18n"]["en"].endswith("a query parameter holds a NUL character")
    assert "caractère NUL" in error["message"]


def test_a_literal_percent_zero_zero_is_just_text(alice, no_server_errors):
    """`%2500` is the text "%00", which PostgreSQL stores: a filter like any other."""
    response = alice.get("/v1/tools/invocations?run_id=%2500")
    assert response.status_code == 200
    assert response.json()["results"] == []


def test_the_admin_refuses_a_nul_too(admin_client, tenant_a, no_server_errors):
    admin_client.raise_request_exception = False
    assert admin_client.get("/admin/gateway/invocation/tinv_%00/change/").status_code == 404
    assert admin_client.get("/admin/gateway/invocation/?q=%00").status_code == 400
    assert admin_client.get("/admin/tenants/tenant/?q=%00").status_code == 400
