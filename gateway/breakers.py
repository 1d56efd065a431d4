"""Circuit breakers per tool (`spec.circuit_breaker`), shared across workers.

closed → `failure_threshold` consecutive failures → open: calls fail fast with 503
`tool_unavailable` and never reach the upstream, until `reset_after` has passed →
half-open: one probe call is let through (claimed atomically), its success closes the
breaker, its failure opens it again. State lives in Redis when EAI_REDIS_URL is set,
else in this process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from eai.integrations import redis as shared
from gateway.manifests import duration_seconds

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class Ticket:
    """The right to call now; `probe` when this call is the half-open probe."""

    allowed: bool
    probe: bool = False
    had_failures: bool = False


def _settings(conf: dict[str, Any] | None) -> tuple[int, float]:
    conf = conf or {}
    return int(conf.get("failure_threshold", 5)), duration_seconds(conf.get("reset_after", "30s"))


class _MemoryStore:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[str, dict[str, float]] = {}

    def read(self, key: str) -> dict[str, float]:
        with self.lock:
            return dict(self.state.get(key, {}))

    def claim_probe(self, key: str, ttl: float) -> bool:
        with self.lock:
            entry = self.state.setdefault(key, {})
            if entry.get("probe_until", 0) > time.time():
                return False
            entry["probe_until"] = time.time() + ttl
            return True

    def failure(self, key: str, threshold: int, reset_after: float) -> None:
        with self.lock:
            entry = self.state.setdefault(key, {})
            entry["failures"] = entry.get("failures", 0) + 1
            if entry["failures"] >= threshold:
                entry["opened_until"] = time.time() + reset_after
                entry.pop("probe_until", None)

    def success(self, key: str) -> None:
        with self.lock:
            self.state.pop(key, None)


class _RedisStore:
    def __init__(self, conn: redis.Redis) -> None:
        self.conn = conn

    def read(self, key: str) -> dict[str, float]:
        raw = self.conn.hgetall(key)
        return {k.decode(): float(v) for k, v in raw.items()}

    def claim_probe(self, key: str, ttl: float) -> bool:
        return bool(self.conn.set(f"{key}:probe", 1, nx=True, px=max(1, int(ttl * 1000))))

    def failure(self, key: str, threshold: int, reset_after: float) -> None:
        failures = self.conn.hincrby(key, "failures", 1)
        if failures >= threshold:
            pipe = self.conn.pipeline()
            pipe.hset(key, "opened_until", time.time() + reset_after)
            pipe.delete(f"{key}:probe")
            pipe.expire(key, int(reset_after) + 3600)
            pipe.execute()

    def success(self, key: str) -> None:
        self.conn.delete(key, f"{key}:probe")


_memory = _MemoryStore()


def _store() -> _MemoryStore | _RedisStore:
    conn = shared.client()
    return _RedisStore(conn) if conn is not None else _memory


def _key(tenant_id: str, tool: str) -> str:
    return f"eai:cb:{tenant_id}:{tool}"


def state(tenant_id: str, tool: str) -> str:
    """closed, open or half_open, for the catalog's availability."""
    try:
        entry = _store().read(_key(tenant_id, tool))
    except redis.RedisError:
        return CLOSED
    opened_until = entry.get("opened_until")
    if not opened_until:
        return CLOSED
    return OPEN if time.time() < opened_until else HALF_OPEN


# A healthy breaker read from Redis is trusted for this long in this process, so the
# common case costs no round trip; a breaker another worker opened is honoured at most
# this late. This process's own failures drop the cached state at once.
CLOSED_CACHE_S = 1.0
_closed_until: dict[str, float] = {}


def acquire(tenant_id: str, tool: str, conf: dict[str, Any] | None) -> Ticket:
    """May a call go upstream now? (Fails open if Redis itself is unreachable.)"""
    store = _store()
    key = _key(tenant_id, tool)
    if _closed_until.get(key, 0.0) > time.monotonic():
        return Ticket(True)
    try:
        entry = store.read(key)
        opened_until = entry.get("opened_until")
        if not opened_until:
            if not entry.get("failures") and isinstance(store, _RedisStore):
                _closed_until[key] = time.monotonic() + CLOSED_CACHE_S
            return Ticket(True, had_failures=bool(entry.get("failures")))
        if time.time() < opened_until:
            return Ticket(False)
        _threshold, reset_after = _settings(conf)
        if store.claim_probe(key, reset_after):
            return Ticket(True, probe=True, had_failures=True)
        return Ticket(False)
    except redis.RedisError:
        return Ticket(True)


def release(
    tenant_id: str, tool: str, conf: dict[str, Any] | None, ticket: Ticket, ok: bool
) -> None:
    """Record the outcome of a call made under `ticket`."""
    store = _store()
    key = _key(tenant_id, tool)
    if not ok:
        _closed_until.pop(key, None)
    try:
        if ok:
            if ticket.had_failures or ticket.probe:
                store.success(key)
        else:
            threshold, reset_after = _settings(conf)
            # A failed probe re-opens at once; otherwise count towards the threshold.
            store.failure(key, 1 if ticket.probe else threshold, reset_after)
    except redis.RedisError:
        pass


def reset_memory() -> None:
    """Forget in-memory breakers and cached states (tests)."""
    _closed_until.clear()
    with _memory.lock:
        _memory.state.clear()
