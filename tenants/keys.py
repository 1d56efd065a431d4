"""Issuing and revoking API keys (each write goes with its audit record)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from tenants.models import ApiKey, Tenant


def issue_api_key(
    *,
    tenant: Tenant,
    scopes: list[str],
    agent: str = "",
    name: str = "",
    user=None,
    created_by=None,
    expires_at=None,
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
    with transaction.atomic():
        key.save()
    return key, raw


def revoke_api_key(*, key: ApiKey) -> bool:
    """Revoke `key`; False if it was already revoked (a conditional update)."""
    with transaction.atomic():
        changed = ApiKey.objects.filter(pk=key.pk, revoked_at=None).update(
            revoked_at=timezone.now()
        )
    return bool(changed)
