"""Open Policy Agent over its REST data API (used when EAI_OPA_URL is set).

`POST {EAI_OPA_URL}/v1/data/eai/tool/decision` with `{"input": …}` answers
`{"result": {...}}`. The policy version recorded with each decision is "opa:" plus
the decision's `policy_version` field when the server's policy sets one.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from django.conf import settings

_POOL = urllib3.PoolManager(maxsize=16, retries=False)


class OpaError(Exception):
    """OPA could not be asked or gave no decision (the gateway then denies)."""


def evaluate(path: str, document: dict[str, Any]) -> dict[str, Any]:
    """The result at `data.<path>` (slash-separated) for `input = document`."""
    url = f"{settings.EAI_OPA_URL.rstrip('/')}/v1/data/{path}"
    try:
        response = _POOL.request(
            "POST",
            url,
            body=json.dumps({"input": document}).encode(),
            headers={"Content-Type": "application/json"},
            timeout=urllib3.Timeout(total=settings.EAI_OPA_TIMEOUT_S),
        )
    except urllib3.exceptions.HTTPError as exc:
        raise OpaError(f"OPA unreachable: {exc.__class__.__name__}") from exc
    if response.status != 200:
        raise OpaError(f"OPA answered HTTP {response.status}")
    try:
        result = json.loads(response.data)["result"]
    except (ValueError, KeyError) as exc:
        raise OpaError("OPA gave no result for the decision") from exc
    if not isinstance(result, dict):
        raise OpaError("OPA's decision is not an object")
    return result


def healthy() -> bool:
    try:
        response = _POOL.request(
            "GET", f"{settings.EAI_OPA_URL.rstrip('/')}/health", timeout=urllib3.Timeout(total=1)
        )
    except urllib3.exceptions.HTTPError:
        return False
    return response.status == 200
