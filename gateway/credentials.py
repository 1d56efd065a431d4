"""Credential leases: the secret a tool call needs, held gateway-side only.

`lease(tenant, name)` returns the secret for one call (OpenBao when EAI_BAO_ADDR is
set, else the in-process store of encrypted rows); `Lease.revoke()` ends it. The secret
is injected into the upstream request per `spec.credential_injection` and never
reaches the agent, a log, a response, an event or the audit chain: the pipeline masks
its exact value wherever it appears.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from eai.integrations import openbao
from eai.process_cache import ProcessCache
from gateway import audit
from gateway.models import StoredCredential, new_id
from gateway.sealing import seal, unseal
from tenants.models import Tenant
from tenants.scope import tenant_scope

PURPOSE = "credential"
KNOWN_TTL_S = 10.0
_known: ProcessCache[list[str]] = ProcessCache(KNOWN_TTL_S, keep=lambda secrets: True)


class CredentialUnavailable(Exception):
    """The credential does not exist or its store cannot lease it."""


@dataclass
class Lease:
    lease_id: str
    name: str
    secret: str = field(repr=False)
    backend: str
    ttl_seconds: int
    _bao_token: str | None = field(default=None, repr=False)

    def headers(self, injection: dict[str, str]) -> dict[str, str]:
        template = injection.get("template", "Bearer {secret}")
        return {injection.get("header", "Authorization"): template.replace("{secret}", self.secret)}

    def revoke(self) -> None:
        if self._bao_token:
            openbao.revoke(self._bao_token)
        self.secret = ""


def set_secret(
    *, tenant: Tenant, name: str, secret: str, actor: str = "system", via: str = "internal"
) -> None:
    """Store (or replace) a secret in the in-process store, encrypted, and record
    `credential.set` in the audit chain in the same transaction (the name, never the
    secret nor anything derived from it)."""
    with tenant_scope(tenant):
        _, created = StoredCredential.objects.update_or_create(
            tenant=tenant,
            name=name,
            defaults={"ciphertext": seal(secret, purpose=PURPOSE), "updated_at": timezone.now()},
        )
        _audit(tenant, "credential.set", actor, name, {"via": via, "replaced": not created})
    _forget_known(tenant)


def delete_secret(*, tenant: Tenant, name: str, actor: str, via: str) -> bool:
    """Delete a secret of the in-process store and record `credential.deleted` in the
    same transaction; whether there was one (nothing is recorded otherwise)."""
    with tenant_scope(tenant):
        deleted, _ = StoredCredential.objects.for_tenant(tenant).filter(name=name).delete()
        if deleted:
            _audit(tenant, "credential.deleted", actor, name, {"via": via})
    _forget_known(tenant)
    return bool(deleted)


def _audit(tenant: Tenant, action: str, actor: str, name: str, payload: dict) -> None:
    entry = audit.Entry(action, actor, f"credential:{name}", {"credential": name, **payload})
    audit.record(tenant, [entry])


def _forget_known(tenant: Tenant) -> None:
    # Dropped now and again once committed (the admin's save runs inside its own
    # transaction): a reload before the commit would read the old secrets and keep them.
    key = str(tenant.pk)
    _known.forget(key)
    transaction.on_commit(lambda: _known.forget(key))


def lease(tenant: Tenant, name: str) -> Lease:
    if settings.EAI_BAO_ADDR:
        try:
            bao = openbao.lease(tenant.slug, name)
        except openbao.BaoError as exc:
            raise CredentialUnavailable(str(exc)) from exc
        return Lease(new_id("lease"), name, bao.secret, "openbao", bao.lease_seconds, bao.token)
    with tenant_scope(tenant, readonly=True):
        row = StoredCredential.objects.for_tenant(tenant).filter(name=name).first()
    if row is None:
        raise CredentialUnavailable(f"no credential '{name}'")
    return Lease(new_id("lease"), name, unseal(row.ciphertext, purpose=PURPOSE), "local", 0)


def known_secrets(tenant: Tenant) -> list[str]:
    """Every secret of the tenant's in-process store, to mask echoes of any of them.

    Decrypting them on every call would cost more than the call, so they are kept: on
    SQLite until a stamp read each call moves (below); elsewhere for KNOWN_TTL_S per
    process, and `set_secret` in this process drops them at once.
    """
    if settings.EAI_BAO_ADDR:
        return []
    if connection.vendor == "sqlite":
        return _known_on_this_file(tenant)
    return _known.get(str(tenant.pk), lambda _key: _read_secrets(tenant))


# SQLite (the embedded default): the tenant's credentials as last read, with the stamp
# (count, latest update) they were read at.
_stamped: dict[str, tuple[tuple, list[str]]] = {}


def _known_on_this_file(tenant: Tenant) -> list[str]:
    """On SQLite every process of the checkout (the server, `set_credential`, the admin)
    shares one local file, and reading the stamp is a local read (about 35 µs a call):
    it is read on every call, so a secret stored by another process is masked from the
    next call on, not up to KNOWN_TTL_S later. Secrets are decrypted again only when the
    stamp moved."""
    table = connection.ops.quote_name(StoredCredential._meta.db_table)
    with connection.cursor() as cursor:
        # The table name comes from the model's metadata; the tenant is a parameter.
        cursor.execute(
            f"SELECT COUNT(*), MAX(updated_at) FROM {table} WHERE tenant_id = %s",  # noqa: S608
            [tenant.pk.hex],
        )
        stamp = tuple(cursor.fetchone())
    key = str(tenant.pk)
    hit = _stamped.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    secrets = _read_secrets(tenant)
    if len(_stamped) >= 10_000:
        _stamped.clear()
    _stamped[key] = (stamp, secrets)
    return secrets


def _read_secrets(tenant: Tenant) -> list[str]:
    with tenant_scope(tenant, readonly=True):
        rows = list(
            StoredCredential.objects.for_tenant(tenant).values_list("ciphertext", flat=True)
        )
    return [unseal(c, purpose=PURPOSE) for c in rows]
