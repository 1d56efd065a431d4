"""A limit on failed logins: after LIMIT failures for one username from one client
address within WINDOW, further attempts at that username from that address are refused
for LOCK_FOR.

Locked per (username, address): locking a username everywhere, or an address for every
username, let anyone lock staff out (five wrong passwords from anywhere, or, behind a
proxy where every client has the proxy's address, five from anyone locked every
account). Attempts are counted in Django's cache by `LockoutBackend`, first in
AUTHENTICATION_BACKENDS, before any password is checked, so every login path (the admin
form, `authenticate()` anywhere) counts and a burst sent at once is held to the limit. It
refuses while a lock holds, even with the right password; `LockoutAdminLoginForm` says
so plainly. A success clears the pair's count.

The client address is REMOTE_ADDR, unless that is one of EAI_TRUSTED_PROXIES: then the
nearest address in X-Forwarded-For that is not a trusted proxy (`client_ip`). A header
from anyone else is ignored (anybody can send one).

The default cache is per process (LocMem): with several server processes each counts
on its own. Production should point CACHES at a shared cache (EAI_CACHE_URL).
"""

from __future__ import annotations

import hashlib
import ipaddress
from datetime import timedelta
from functools import cache as memoized
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

LIMIT = 5
WINDOW = timedelta(minutes=15)
LOCK_FOR = timedelta(minutes=15)

LOCKED_MESSAGE = _(
    "Too many failed login attempts. Login is blocked for 15 minutes; try again later."
)


def _key(kind: str, what: str, value: str) -> str:
    # Hashed: usernames may hold characters some cache backends refuse in keys.
    digest = hashlib.sha256(value.encode()).hexdigest()[:32]
    return f"eai:login:{kind}:{what}:{digest}"


def _subjects(username: str | None, ip: str | None) -> list[tuple[str, str]]:
    """What an attempt counts against: its (username, address) pair. With no username
    there is no account to lock."""
    if not username:
        return []
    return [("pair", f"{username.strip().lower()}\n{ip or '-'}")]


@memoized
def _trusted(proxies: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(p, strict=False) for p in proxies)


def _address(raw: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(raw.strip())
    except ValueError:
        return None
    # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d: the same client.
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def client_ip(request: HttpRequest | None) -> str | None:
    """The client's address: REMOTE_ADDR, or, when that is a trusted proxy
    (EAI_TRUSTED_PROXIES), the nearest X-Forwarded-For hop that is not one. Each proxy
    appends the address it was reached from, so the hops right of the client's are
    trusted proxies' and anything left of it is whatever the client wrote."""
    if request is None:
        return None
    address = request.META.get("REMOTE_ADDR") or None
    networks = _trusted(tuple(settings.EAI_TRUSTED_PROXIES))
    if not networks or address is None:
        return address
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        current = _address(address)
        if current is None or not any(current in network for network in networks):
            break  # not a proxy we trust: the client
        forwarded = _address(hop)
        if forwarded is None:
            break  # no header, or junk: the trusted proxy stands for its client
        address = str(forwarded)
    return address


def is_locked(username: str | None, ip: str | None) -> bool:
    """Whether attempts at this username from this address are refused now."""
    keys = [_key("lock", what, value) for what, value in _subjects(username, ip)]
    return bool(keys) and bool(cache.get_many(keys))


def _counted(key: str) -> int:
    """Add one to the count at `key` (its window starts with the first: add() sets the
    expiry, incr() keeps it, so the window is fixed, not sliding); the new count."""
    cache.add(key, 0, timeout=int(WINDOW.total_seconds()))
    try:
        return cache.incr(key)
    except ValueError:  # expired between add() and incr()
        cache.add(key, 1, timeout=int(WINDOW.total_seconds()))
        return 1


def count_attempt(username: str | None, ip: str | None) -> bool:
    """Count one attempt against the (username, address) pair before its password is
    checked; False once more than LIMIT are counted in the window (failures, and
    attempts still in progress). It refuses, it does not lock: only failures lock
    (`record_failure`), so logins that succeed together never lock anyone out.

    Counting after the check let attempts sent at once all pass the lock while their
    passwords were being hashed: 17 checked in a burst of 40, not 5. A success takes
    its attempt back (`_on_logged_in`)."""
    allowed = True
    for what, value in _subjects(username, ip):
        if _counted(_key("try", what, value)) > LIMIT:
            allowed = False
    return allowed


def record_failure(username: str | None, ip: str | None) -> None:
    """Count one failure; lock the (username, address) pair on reaching LIMIT within
    WINDOW."""
    for what, value in _subjects(username, ip):
        if _counted(_key("fail", what, value)) >= LIMIT:
            # add(), not set(): attempts made while locked do not extend the lock.
            cache.add(_key("lock", what, value), True, timeout=int(LOCK_FOR.total_seconds()))


def reset(username: str | None, ip: str | None = None) -> None:
    """Forget the attempts, failures and lock of this username from this address."""
    keys = []
    for what, value in _subjects(username, ip):
        keys += [_key(kind, what, value) for kind in ("try", "fail", "lock")]
    cache.delete_many(keys)


@receiver(user_login_failed, dispatch_uid="eai_lockout_failed")
def _on_login_failed(sender: Any, credentials: dict, request: HttpRequest | None = None, **kw):
    record_failure(credentials.get("username"), client_ip(request))


@receiver(user_logged_in, dispatch_uid="eai_lockout_success")
def _on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kw: Any) -> None:
    reset(user.get_username(), client_ip(request))


class LockoutBackend:
    """Refuses authentication while locked; otherwise defers to the next backend.

    Raising PermissionDenied stops Django's authenticate() from trying later backends.
    It has no `get_user()` on purpose: it never logs anyone in, and without one Django's
    `force_login` and session lookups skip it for the next backend.
    """

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, **kwargs: Any
    ) -> None:
        ip = client_ip(request)
        if is_locked(username, ip) or not count_attempt(username, ip):
            raise PermissionDenied(str(LOCKED_MESSAGE))
        return None


class LockoutAdminLoginForm(AdminAuthenticationForm):
    """The admin login form, answering a locked attempt with its own message."""

    def clean(self) -> dict[str, Any]:
        if is_locked(self.data.get("username"), client_ip(self.request)):
            raise ValidationError(LOCKED_MESSAGE, code="locked")
        return super().clean()
