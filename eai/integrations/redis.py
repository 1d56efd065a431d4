"""The shared Redis client (EAI_REDIS_URL), or None in the embedded default.

Rate limits, circuit breakers and other state that must agree across worker processes
live in Redis when it is configured; without it they live in this process's memory,
which is exact because the embedded server runs one process.
"""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def client() -> redis.Redis | None:
    if not settings.EAI_REDIS_URL:
        return None
    return redis.Redis.from_url(
        settings.EAI_REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0
    )


def healthy() -> bool:
    conn = client()
    if conn is None:
        return True
    try:
        return bool(conn.ping())
    except redis.RedisError:
        return False
