"""Builtin tools: Python callables a manifest names with `endpoint: {type: builtin}`.

Only callables registered here can be named, so a manifest cannot reach arbitrary code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any


class BuiltinError(Exception):
    """A builtin tool's failure (answered as `tool_error`)."""


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return {"echo": payload}


def demo_jira_search(payload: dict[str, Any]) -> dict[str, Any]:
    """A deterministic stand-in for Jira search. Its text holds an IBAN on purpose: the
    demo shows the gateway masking personal data in tool output."""
    query = str(payload.get("q", ""))
    key = query if query.upper().startswith("INC-") else "INC-42"
    return {
        "issues": [
            {
                "key": key.upper(),
                "summary": "Refund requested by customer",
                "description": "Please refund to IBAN FR7630006000011234567890189 today.",
                "status": "open",
            }
        ]
    }


def demo_payments_transfer(payload: dict[str, Any]) -> dict[str, Any]:
    """A deterministic stand-in for a payment order (non-idempotent in its manifest)."""
    amount = str(payload.get("amount", ""))
    if amount.startswith("-"):
        raise BuiltinError("amount must be positive")
    digest = hashlib.sha256(repr(sorted(payload.items())).encode()).hexdigest()[:12]
    return {"transfer_id": f"trf_{digest}", "status": "executed", "amount": amount}


REGISTRY: dict[str, Callable[[dict[str, Any]], Any]] = {
    "echo": echo,
    "demo.jira_search": demo_jira_search,
    "demo.payments_transfer": demo_payments_transfer,
}
