"""Tenants, staff memberships and API keys.

These three tables stay outside the tenant row-level policy: a key is looked up before
its tenant is known, and staff membership decides which tenants a person may enter.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, models
from django.db.models.expressions import Col
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from eai.process_cache import ProcessCache

KEY_RE = re.compile(r"^eai_([A-Za-z0-9]+)_([A-Za-z0-9]+)$")
_ALNUM = string.ascii_letters + string.digits


def random_alnum(length: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(length))


def key_digest(secret: str) -> str:
    """SHA-256 of the key's secret part.

    The secret is 40 random characters (~238 bits), so a fast hash is enough; a slow
    password hash would only cost time on every API call.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    # Spending cap per calendar month (in `budget_currency`); calls beyond it are denied.
    monthly_budget = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    budget_currency = models.CharField(max_length=3, default="EUR")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def public_id(self) -> str:
        return f"ten_{self.id.hex}"


class Membership(models.Model):
    """A staff user's membership of a tenant (reviewers, tenant admins)."""

    ROLE_REVIEWER = "reviewer"
    ROLE_ADMIN = "admin"
    ROLES = [(ROLE_REVIEWER, "Reviewer"), (ROLE_ADMIN, "Tenant admin")]

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=ROLES, default=ROLE_REVIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="uniq_membership")]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class ApiKeyQuerySet(models.QuerySet):
    def for_raw_key(self, raw: str) -> ApiKey | None:
        """The usable key for a raw `eai_<id>_<secret>` string, or None.

        None covers every failure alike (malformed, unknown, wrong secret, expired,
        revoked, inactive tenant) so a caller cannot tell which one it hit.
        """
        match = KEY_RE.match(raw)
        if not match:
            return None
        key_id, secret = match.groups()
        key = _cached_key(key_id)
        if key is None:
            # Spend the same hashing work as a real check, to not reveal which ids exist.
            hmac.compare_digest(key_digest(secret), "0" * 64)
            return None
        if not hmac.compare_digest(key.digest, key_digest(secret)):
            return None
        if not key.is_usable():
            return None
        return key


def _converters(model: type[models.Model], alias: str) -> list[tuple[Any, list[Any]]]:
    return [
        (f, f.get_db_converters(connection) + connection.ops.get_db_converters(Col(alias, f)))
        for f in model._meta.concrete_fields
    ]


def _build(model: type[models.Model], converters: list, values: tuple) -> models.Model:
    attrs = []
    for (f, convs), value in zip(converters, values, strict=True):
        for convert in convs:
            value = convert(value, Col("", f), connection)
        attrs.append(value)
    return model.from_db(connection.alias, [f.attname for f, _ in converters], attrs)


def _key_with_tenant(key_id: str) -> ApiKey | None:
    """The key and its tenant in one plain statement.

    Every API call runs this first: the ORM's query compilation here costs several
    times the database's own time, so the SQL is written out once and the values go
    through the same converters the ORM would apply.
    """
    keys, tenants = _converters(ApiKey, "k"), _converters(Tenant, "t")
    columns = [f"k.{connection.ops.quote_name(f.column)}" for f, _ in keys]
    columns += [f"t.{connection.ops.quote_name(f.column)}" for f, _ in tenants]
    sql = (
        f"SELECT {', '.join(columns)} FROM tenants_apikey k "  # noqa: S608 - fixed names
        "JOIN tenants_tenant t ON t.id = k.tenant_id WHERE k.key_id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [key_id])
        row = cursor.fetchone()
    if row is None:
        return None
    key = _build(ApiKey, keys, row[: len(keys)])
    key.tenant = _build(Tenant, tenants, row[len(keys) :])
    return key


# Keys as last read, per process, for KEY_CACHE_S: the lookup runs on every API call.
# Saving a key or a tenant in this process (revocation included) forgets them at once;
# another process sees a revocation at most KEY_CACHE_S late.
KEY_CACHE_S = 2.0
_key_cache: ProcessCache[ApiKey | None] = ProcessCache(KEY_CACHE_S)


def _cached_key(key_id: str) -> ApiKey | None:
    # Unknown ids are not cached: guessing must not fill memory.
    return _key_cache.get(key_id, _key_with_tenant)


def cached_tenant_id(raw: str) -> Any | None:
    """The tenant of a raw key if this process has the key cached and it is usable, or
    None; never touches the database (the server's event loop asks, for its early 429)."""
    match = KEY_RE.match(raw)
    if not match:
        return None
    key = _key_cache.peek(match[1])
    if key is None or not hmac.compare_digest(key.digest, key_digest(match[2])):
        return None
    return key.tenant_id if key.is_usable() else None


def forget_cached_keys(**kwargs: Any) -> None:
    """Drop every cached key (a key or tenant changed in this process)."""
    _key_cache.clear()


class ApiKey(models.Model):
    """An API key. Only the digest of its secret is stored; the raw key is shown once."""

    key_id = models.CharField(max_length=32, unique=True)
    digest = models.CharField(max_length=64)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True)
    agent = models.CharField(max_length=200, blank=True, help_text="Agent this key belongs to.")
    scopes = models.JSONField(default=list)
    # The staff user the key is issued to (keys that may decide approvals), if any.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_keys",
    )
    # Who issued it (None: the platform, from the command line). Protected: a key issued
    # to a reviewer by another user may not decide approvals (its issuer saw the secret),
    # and deleting the issuer must not turn it into one that may.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.agent or self.name or 'key'})"

    @property
    def public_id(self) -> str:
        return f"key_{self.key_id}"

    def is_usable(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        if self.expires_at is not None and self.expires_at <= now:
            return False
        return self.tenant.is_active

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    @classmethod
    def new(cls, **fields) -> tuple[ApiKey, str]:
        """An unsaved key and its raw form `eai_<id>_<secret>` (to show exactly once)."""
        key_id, secret = random_alnum(16), random_alnum(40)
        key = cls(key_id=key_id, digest=key_digest(secret), **fields)
        return key, f"eai_{key_id}_{secret}"


post_save.connect(forget_cached_keys, sender=ApiKey, dispatch_uid="eai-forget-keys-apikey")
post_save.connect(forget_cached_keys, sender=Tenant, dispatch_uid="eai-forget-keys-tenant")
post_delete.connect(forget_cached_keys, sender=ApiKey, dispatch_uid="eai-forget-keys-apikey-del")
post_delete.connect(forget_cached_keys, sender=Tenant, dispatch_uid="eai-forget-keys-tenant-del")
