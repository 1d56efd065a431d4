"""Re-reading `mcp` tools' upstream definitions (the rug-pull defence), and drafting
manifests from an MCP server's tools (`manage.py mcp_discover`).

A re-sync never changes the reviewed baseline: a definition that differs from the
pinned one closes the tool (`mcp_drift`, 503 `tool_unavailable`, availability
`definition_changed`) and records `tool.drift` in the audit chain, in one transaction.
Only applying the manifest again (a person's review) reopens it.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from gateway import audit, credentials, mcp_client
from gateway.endpoints import resolved_refusal
from gateway.models import Tool
from tenants.models import Tenant
from tenants.scope import tenant_scope

logger = logging.getLogger(__name__)


class Listings:
    """Tool listings of MCP servers as one tenant reads them, each server read once per
    batch (an apply of twenty tools drafted from one server lists it once, not twenty
    times). Keyed by URL and the credential sent, since a server may list per caller."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        self.read: dict[tuple[str, str, str], list[dict[str, Any]] | Exception] = {}

    def definition(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        """The definition of `spec`'s endpoint tool, None when the server has no such
        tool; raises MCPCallError or CredentialUnavailable."""
        endpoint = spec["endpoint"]
        ref = spec.get("credential_ref") or ""
        injection = spec.get("credential_injection") or {}
        key = (endpoint["url"], ref, json.dumps(injection, sort_keys=True) if ref else "")
        if key not in self.read:
            self.read[key] = self._list(endpoint, ref, injection)
        listed = self.read[key]
        if isinstance(listed, Exception):
            raise listed
        return next((d for d in listed if d.get("name") == endpoint["tool"]), None)

    def _list(
        self, endpoint: dict[str, Any], ref: str, injection: dict[str, str]
    ) -> list[dict[str, Any]] | Exception:
        lease = None
        try:
            headers: dict[str, str] = {}
            if ref:
                lease = credentials.lease(self.tenant, ref)
                headers = lease.headers(injection)
            return mcp_client.list_definitions(
                endpoint["url"],
                headers=headers,
                timeout_s=min(endpoint.get("timeout_ms", 30000), 30000) / 1000,
            )
        except (mcp_client.MCPCallError, credentials.CredentialUnavailable) as exc:
            return exc
        finally:
            if lease is not None:
                lease.revoke()


@dataclass
class Checked:
    tool: str
    outcome: str  # same | drift | unreachable | forbidden | still_drifted
    pinned: str = ""
    found: str = ""


def resync_tenant(tenant: Tenant) -> list[Checked]:
    """Read every `mcp` tool's definition again and close those that changed."""
    with tenant_scope(tenant, readonly=True):
        tools = [
            t
            for t in Tool.objects.for_tenant(tenant).order_by("name")
            if t.spec["endpoint"]["type"] == "mcp" and t.mcp_pin
        ]
    listings = Listings(tenant)
    return [_check(tenant, tool, listings) for tool in tools]


def resync_all() -> list[tuple[str, Checked]]:
    """Every active tenant, one by one (each under its own tenant scope)."""
    done = []
    for tenant in Tenant.objects.filter(is_active=True).order_by("slug"):
        done += [(tenant.slug, c) for c in resync_tenant(tenant)]
    return done


def _check(tenant: Tenant, tool: Tool, listings: Listings) -> Checked:
    endpoint = tool.spec["endpoint"]
    if resolved_refusal(endpoint["url"]):
        return Checked(tool.name, "forbidden", tool.mcp_pin)
    try:
        definition = listings.definition(tool.spec)
    except (mcp_client.MCPCallError, credentials.CredentialUnavailable) as exc:
        # Unreachable is an outage, not a change: the breaker answers for it.
        logger.warning("mcp re-sync of %s/%s: %s", tenant.slug, tool.name, exc)
        return Checked(tool.name, "unreachable", tool.mcp_pin)
    # A tool the server no longer lists has changed too: its definition is `null`.
    try:
        found = mcp_client.definition_digest(definition) if definition is not None else "absent"
    except mcp_client.MCPCallError:
        found = "uncanonical"  # it was pinned, so it changed
    if found == tool.mcp_pin:
        return Checked(tool.name, "still_drifted" if tool.mcp_drift else "same", tool.mcp_pin)
    if tool.mcp_drift and tool.mcp_drift.get("digest") == found:
        return Checked(tool.name, "still_drifted", tool.mcp_pin, found)
    _record_drift(tenant, tool.name, found, definition)
    logger.warning(
        "mcp tool %s/%s closed: its definition changed (pinned %s, found %s)",
        tenant.slug,
        tool.name,
        tool.mcp_pin,
        found,
    )
    return Checked(tool.name, "drift", tool.mcp_pin, found)


def _record_drift(tenant: Tenant, name: str, found: str, definition: dict[str, Any] | None) -> None:
    from gateway.pipeline import forget_cached_tools

    with tenant_scope(tenant):
        tool = Tool.objects.for_tenant(tenant).select_for_update().filter(name=name).first()
        if tool is None or not tool.mcp_pin or tool.mcp_pin == found:
            return  # removed or re-applied meanwhile
        now = timezone.now()
        tool.mcp_drift = {
            "digest": found,
            "definition": definition,
            "pinned": tool.mcp_pin,
            "detected_at": now.isoformat(),
        }
        tool.updated_at = now
        tool.save(update_fields=["mcp_drift", "updated_at"])
        audit.record(
            tenant,
            [
                audit.Entry(
                    "tool.drift",
                    "system",
                    f"tool:{name}",
                    {
                        "tool": name,
                        "version": tool.version,
                        "revision": tool.revision,
                        "pinned_digest": tool.mcp_pin,
                        "found_digest": found,
                    },
                )
            ],
        )
        forget_cached_tools()


# --- discovery -------------------------------------------------------------------------

_NAME_RE = re.compile(r"[^a-z0-9._-]+")


def draft_manifests(
    url: str, definitions: list[dict[str, Any]], *, credential: str | None = None
) -> list[dict[str, Any]]:
    """A draft `Tool` manifest per upstream definition, pinned, for a person to review:
    the description is the upstream's and is shown for review, never trusted."""
    drafts = []
    for definition in definitions:
        try:
            pin = mcp_client.definition_digest(definition)
        except mcp_client.MCPCallError:
            continue  # cannot be pinned, so cannot be applied: left out (the command says so)
        name = _NAME_RE.sub("_", str(definition.get("name", "tool")).lower()).strip("._-")
        annotations = definition.get("annotations") or {}
        read_only = annotations.get("readOnlyHint") is True
        spec: dict[str, Any] = {
            "input_schema": definition.get("inputSchema") or {"type": "object"},
            "endpoint": {
                "type": "mcp",
                "url": url,
                "tool": definition.get("name", ""),
                "timeout_ms": 5000,
                "pin": pin,
            },
            # Conservative until reviewed: the upstream's hints are claims, not facts.
            "action_class": "read" if read_only else "write",
            "risk_class": "low" if read_only else "medium",
            "idempotent": annotations.get("idempotentHint") is True,
            "network": "external" if annotations.get("openWorldHint", True) else "internal",
        }
        if definition.get("outputSchema"):
            spec["output_schema"] = definition["outputSchema"]
        if credential:
            spec["credential_ref"] = credential
        drafts.append(
            {
                "apiVersion": "eai/v1",
                "kind": "Tool",
                "metadata": {
                    "name": name[:200] or "tool",
                    "version": "0.1.0",
                    "description": str(definition.get("description") or "")[:2000],
                },
                "spec": spec,
            }
        )
    return drafts
