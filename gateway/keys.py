"""Issuing and revoking API keys, each with its audit record in the same transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from gateway import audit
from tenants.models import ApiKey, Tenant, forget_cached_keys
from tenants.scope import tenant_scope


def issue_api_key(
    *,
    tenant: Tenant,
    scopes: list[str],
    agent: str = "",
    name: str = "",
    user: Any = None,
    created_by: Any = None,
    expires_at: datetime | None = None,
    actor: str = "",
) -> tuple[ApiKey, str]:
    """Create a key; return it with its raw form, which is never stored or shown again."""
    key, raw = ApiKey.new(
        tenant=tenant,
        scopes=list(scopes),
        agent=agent,
        name=name,
        user=user,
        created_by=created_by,
        expires_at=expires_at,
    )
    with tenant_scope(tenant):
        key.save()
        audit.record(
            tenant,
            [
                audit.Entry(
                    "apikey.created",
                    actor or (f"user:{created_by.pk}" if created_by else "system"),
                    key.public_id,
                    {
                        "key_id": key.public_id,
                        "agent": agent,
                        "scopes": list(scopes),
                        "user": user.pk if user else None,
                        "expires_at": expires_at.isoformat() if expires_at else None,
                    },
                )
            ],
        )
    return key, raw


AUDITED_FIELDS = ("scopes", "agent", "name", "expires_at")


def change_api_key(*, key: ApiKey, actor: str) -> None:
    """Save the editable fields of `key` with their audit record (what changed, never
    the digest), in one transaction; only those fields are written (a revocation made
    meanwhile stays), and cached lookups of the key are dropped so the change holds."""
    with tenant_scope(key.tenant):
        before = ApiKey.objects.select_for_update().get(pk=key.pk)
        changes = {
            field: {"from": _plain(getattr(before, field)), "to": _plain(getattr(key, field))}
            for field in AUDITED_FIELDS
            if getattr(before, field) != getattr(key, field)
        }
        key.save(update_fields=list(AUDITED_FIELDS))
        forget_cached_keys()
        if changes:
            audit.record(
                key.tenant,
                [
                    audit.Entry(
                        "apikey.changed",
                        actor,
                        key.public_id,
                        {"key_id": key.public_id, "changes": changes},
                    )
                ],
            )


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def revoke_api_key(*, key: ApiKey, actor: str = "system") -> bool:
    """Revoke `key`; False if it was already revoked (a conditional update)."""
    with tenant_scope(key.tenant):
        changed = ApiKey.objects.filter(pk=key.pk, revoked_at=None).update(
            revoked_at=timezone.now()
        )
        if changed:
            forget_cached_keys()
            audit.record(
                key.tenant,
                [audit.Entry("apikey.revoked", actor, key.public_id, {"key_id": key.public_id})],
            )
    return bool(changed)
