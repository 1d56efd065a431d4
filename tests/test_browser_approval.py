"""In a real browser: Alice's agent parks a payment, Rita logs in to the admin portal,
finds it in her queue, reads it and approves it with a reason; the agent then sees the
call succeed.

Drives Debian's Chromium (/usr/bin/chromium) with Playwright against pytest-django's
`live_server` (never a browser downloaded by `playwright install`: no internet here).
Leaves a screenshot of the approval page in test-artifacts/approval-page.png.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from guardian.shortcuts import assign_perm

from gateway.keys import issue_api_key
from gateway.models import Invocation, Tool
from tenants import lockout
from tenants.models import Membership
from tenants.scope import tenant_scope

from .conftest import ALL_SCOPES, seed_tenant

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    # Without these Chromium keeps trying to reach hosts it cannot reach from here.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
IBAN = "FR7630006000011234567890189"
PASSWORD = "rita's long passphrase"
SCREENSHOT = Path(settings.BASE_DIR) / "test-artifacts" / "approval-page.png"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None


def agent_call(base: str, raw_key: str, method: str, path: str, body: dict | None = None):
    """The agent's side, over real HTTP: (status, JSON body)."""
    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {raw_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def dlp_masks_stored_input(tenant, invocation_id: str) -> bool:
    """Whether the lead's DLP has landed: gateway/dlp.py exists and the stored input no
    longer holds the raw IBAN."""
    dlp_module = Path(settings.BASE_DIR) / "gateway" / "dlp.py"
    with tenant_scope(tenant, readonly=True):
        stored = json.dumps(Invocation.objects.get(pk=invocation_id).input)
    return dlp_module.exists() and IBAN not in stored


@pytest.mark.django_db(transaction=True)
def test_it_lets_rita_approve_a_parked_payment_in_a_browser(live_server):
    if sync_playwright is None:
        pytest.skip("the playwright package is not installed (pip install -r requirements.lock)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")

    acme = seed_tenant("acme")
    rita = get_user_model().objects.create_user("rita", password=PASSWORD, is_staff=True)
    rita.user_permissions.set(
        Permission.objects.filter(codename__in=["view_approvalrequest", "view_invocation"])
    )
    Membership.objects.create(user=rita, tenant=acme)
    with tenant_scope(acme, readonly=True):
        payments = Tool.objects.get(tenant=acme, name="payments.transfer")
    assign_perm("gateway.review_tool", rita, payments)
    _, agent_key = issue_api_key(tenant=acme, scopes=ALL_SCOPES, agent="alice-agent")
    lockout.reset("rita", "127.0.0.1")

    status, parked = agent_call(
        live_server.url,
        agent_key,
        "POST",
        "/v1/tools/payments.transfer/invoke",
        {
            "input": {"iban": IBAN, "amount": "120.00", "reference": "Refund INC-42"},
            "run_id": "run_browser",
        },
    )
    assert status == 202 and parked["status"] == "waiting_approval"
    approval_id, invocation_id = parked["approval_id"], parked["invocation_id"]
    # Asked before the browser starts: Playwright's sync API runs an event loop in this
    # thread, inside which Django refuses database queries.
    masked = dlp_masks_stored_input(acme, invocation_id)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/")
            page.fill("#id_username", "rita")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(f"{live_server.url}/admin/")

            page.goto(f"{live_server.url}/admin/gateway/approvalrequest/")
            page.click(f"text={approval_id}")
            page.wait_for_selector("#decide-form")
            html = page.content()
            assert approval_id in html and "payments.transfer" in html
            assert "FR76" in html
            if masked:
                assert IBAN not in html

            page.fill("#id_reason", "Refund of INC-42 checked with the customer")
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)

            page.click("#approve-button")
            page.wait_for_selector("text=is now approved")
            assert page.inner_text("#approval-status") == "approved"
        finally:
            browser.close()

    # The approved call runs on the in-process pool once the decision commits.
    status, body = agent_call(
        live_server.url, agent_key, "GET", f"/v1/tools/invocations/{invocation_id}?wait=10"
    )
    assert status == 200
    assert body["status"] == "succeeded", body
    assert body["output"]["status"] == "executed"
    lockout.reset("rita", "127.0.0.1")
