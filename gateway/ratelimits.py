"""Per-tool rate limits (`spec.rate_limit`), shared across workers.

The `limits` library's moving window, on Redis when EAI_REDIS_URL is set, else in
memory. One tenant's burst never throttles another: every key carries the tenant.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from limits import RateLimitItemPerSecond, storage, strategies

from gateway.manifests import duration_seconds


class StoreUnreachable(Exception):
    """The windows' store (Redis) cannot be reached: the limit cannot be counted."""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: int
    remaining: int
    reset_after: int  # seconds until the window frees a slot

    def headers(self) -> dict[str, str]:
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset_after),
        }
        if not self.allowed:
            headers["Retry-After"] = str(max(1, self.reset_after))
        return headers


_LIMITER: strategies.MovingWindowRateLimiter | None = None
_LIMITER_LOCK = threading.Lock()


def _limiter() -> strategies.MovingWindowRateLimiter:
    """One limiter a process, made once under a lock: `functools.cache` may run the
    function in several threads at once, and the first burst's hits then went to
    in-memory stores that were dropped (14 calls through a limit of 5)."""
    global _LIMITER
    limiter = _LIMITER
    if limiter is None:
        with _LIMITER_LOCK:
            if _LIMITER is None:
                uri = settings.EAI_REDIS_URL or "memory://"
                _LIMITER = strategies.MovingWindowRateLimiter(storage.storage_from_string(uri))
            limiter = _LIMITER
    return limiter


def reset_memory() -> None:
    """Forget the limiter and its in-memory windows (tests; the server never needs it)."""
    global _LIMITER
    with _LIMITER_LOCK:
        _LIMITER = None


def check(
    rate_limit: dict[str, Any] | None, *, tenant_id: str, tool: str, key_id: str, run_id: str
) -> Verdict | None:
    """Count one call against the tool's limit; None when the tool has no limit."""
    if not rate_limit:
        return None
    seconds = max(1, math.ceil(duration_seconds(rate_limit["per"])))
    item = RateLimitItemPerSecond(rate_limit["requests"], seconds)
    scope = rate_limit.get("scope", "tenant")
    subject = {"tenant": "-", "key": key_id, "run": run_id or key_id}[scope]
    limiter = _limiter()
    identifiers = ("eai", tenant_id, tool, scope, subject)
    try:
        allowed = limiter.hit(item, *identifiers)
        stats = limiter.get_window_stats(item, *identifiers)
    except Exception as exc:  # redis-py's and the limits library's errors alike
        raise StoreUnreachable from exc
    reset_after = max(0, math.ceil(stats.reset_time - time.time()))
    return Verdict(allowed, rate_limit["requests"], max(0, stats.remaining), reset_after)
