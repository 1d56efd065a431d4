"""OpenBao (the open Vault fork) through `hvac`, used when EAI_BAO_ADDR is set.

A lease per call: a child token with a short TTL and two uses is created with the
gateway's token (EAI_BAO_TOKEN), the secret is read with it from the KV v2 engine at
`<EAI_BAO_MOUNT>/data/eai/<tenant slug>/<credential name>` (field `value`), and the
child token is revoked after the call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import hvac
import requests
from django.conf import settings


class BaoError(Exception):
    """OpenBao could not lease the credential."""


@dataclass
class BaoLease:
    token: str
    lease_seconds: int
    secret: str


def _client(token: str) -> hvac.Client:
    return hvac.Client(url=settings.EAI_BAO_ADDR, token=token, timeout=settings.EAI_BAO_TIMEOUT_S)


def lease(tenant_slug: str, name: str) -> BaoLease:
    try:
        created = _client(settings.EAI_BAO_TOKEN).auth.token.create(
            ttl=settings.EAI_BAO_LEASE_TTL, num_uses=2, renewable=False, meta={"eai": name}
        )
        child = created["auth"]["client_token"]
        read = _client(child).secrets.kv.v2.read_secret_version(
            path=f"eai/{tenant_slug}/{name}",
            mount_point=settings.EAI_BAO_MOUNT,
            raise_on_deleted_version=True,
        )
        secret = read["data"]["data"]["value"]
    except (hvac.exceptions.VaultError, requests.RequestException, KeyError, TypeError) as exc:
        raise BaoError(f"OpenBao could not lease '{name}': {exc.__class__.__name__}") from exc
    return BaoLease(child, int(created["auth"].get("lease_duration", 0)), str(secret))


def revoke(token: str) -> None:
    # A failed revoke is harmless: the lease expires on its own within its TTL.
    with contextlib.suppress(hvac.exceptions.VaultError, requests.RequestException):
        _client(token).auth.token.revoke_self()


def healthy() -> bool:
    try:
        return bool(_client(settings.EAI_BAO_TOKEN).sys.read_health_status(method="GET"))
    except (hvac.exceptions.VaultError, requests.RequestException):
        return False
