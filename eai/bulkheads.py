"""Bulkheads: no tenant holds more than its share of a process (SPEC §14).

A server process has a fixed number of request slots (the threads that serve requests:
`--threads`, or `EAI_REQUEST_SLOTS` under a server that does not say) and of threads
that run queued calls in process. One slow tool of one tenant, called many times at
once, would take them all and stall every other tenant and `/healthz`. Here each
owner (a tenant, or "keyless" for requests whose key is not known yet) holds at most
`EAI_TENANT_SHARE` of them (half by default) and never fewer than
`EAI_TENANT_MIN_SLOTS` (8); a request past its owner's share answers 429
`rate_limited` with `Retry-After` at once, a queued call past it waits its turn behind
that tenant's own calls only.

A request without an API key holds a keyless slot (`RequestSlots`, the outermost WSGI
layer): the portal, the docs, `/readyz`, `/metrics` share one keyless share, so
anonymous clients cannot starve the tenants either. A request presenting an API key
takes its tenant's slot once the key is known (`enter_tenant`, right after
authentication); until then it holds none, so a tenant's flood of requests waiting to be
refused never crowds another tenant out of the keyless share (a bad key is refused
as fast as a good one is found). `/healthz` takes no slot: a probe must answer whatever
the load.

Every tenant's sync upstream calls run in its request slots and its queued ones in its
task-thread share, so a tenant's upstream calls in flight are bounded by the two shares
together: half of the process's, with the defaults.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings

from eai.errors import ApiError, envelope, request_language

logger = logging.getLogger(__name__)

KEYLESS = "keyless"
RETRY_AFTER_S = 1
_TICKET = "eai.request_slot"


def share_of(total: int) -> int:
    """One owner's share of `total` slots: EAI_TENANT_SHARE of them, at least
    EAI_TENANT_MIN_SLOTS."""
    return max(int(settings.EAI_TENANT_MIN_SLOTS), int(total * float(settings.EAI_TENANT_SHARE)))


class Bulkhead:
    """Counts what each owner holds; `try_acquire` refuses past the owner's share."""

    def __init__(self, total: int, share: int) -> None:
        self.total = total
        self.share = share
        self._lock = threading.Lock()
        self._held: dict[Any, int] = {}
        self.full: frozenset[Any] = frozenset()  # the owners holding their whole share

    def try_acquire(self, owner: Any) -> bool:
        with self._lock:
            held = self._held.get(owner, 0)
            if held >= self.share:
                return False
            self._held[owner] = held + 1
            if held + 1 >= self.share:
                self.full = self.full | {owner}
            return True

    def release(self, owner: Any) -> None:
        with self._lock:
            left = self._held.get(owner, 0) - 1
            if left > 0:
                self._held[owner] = left
            else:
                self._held.pop(owner, None)
            if owner in self.full:
                self.full = self.full - {owner}

    def held(self, owner: Any) -> int:
        with self._lock:
            return self._held.get(owner, 0)


_REQUESTS: Bulkhead | None = None
_REQUESTS_LOCK = threading.Lock()


def request_slots() -> Bulkhead:
    """This process's request slots, sized once from the server's thread count."""
    global _REQUESTS
    if _REQUESTS is None:
        from eai import workers  # noqa: PLC0415 - set by the gunicorn worker, if any

        with _REQUESTS_LOCK:
            if _REQUESTS is None:
                total = workers.REQUEST_THREADS or int(settings.EAI_REQUEST_SLOTS)
                _REQUESTS = Bulkhead(total, share_of(total))
    return _REQUESTS


class _Ticket:
    """The slot one request holds, and whose it is; released exactly once."""

    __slots__ = ("bulkhead", "owner")

    def __init__(self, bulkhead: Bulkhead, owner: Any) -> None:
        self.bulkhead = bulkhead
        self.owner = owner

    def release(self) -> None:
        if self.owner is not None:
            self.bulkhead.release(self.owner)
            self.owner = None


def rate_limited() -> ApiError:
    return ApiError(
        "rate_limited",
        retry_after=RETRY_AFTER_S,
        headers={"Retry-After": str(RETRY_AFTER_S)},
        details={"limit": "concurrency"},
    )


def enter_tenant(meta: dict[str, Any], tenant_id: Any) -> None:
    """Move the request's slot from keyless to its tenant, once the key is known;
    raises 429 `rate_limited` when the tenant holds its whole share already. Called
    again for the same tenant (DRF authenticates twice on some paths), it does nothing."""
    ticket: _Ticket | None = meta.get(_TICKET)
    if ticket is None or ticket.owner == tenant_id:
        return  # no slot layer in front (the test client), or already moved
    if not ticket.bulkhead.try_acquire(tenant_id):
        raise rate_limited()
    ticket.release()  # a keyless slot, if the key came another way than the header
    ticket.owner = tenant_id


def early_refusal(head: bytes) -> bytes | None:
    """For the server's event loop, before a request reaches a thread: the whole 429
    answer when its key is cached in this process and its tenant holds its whole share
    already, else None (the app decides, as for any request). A tenant's flood of
    calls past its share then costs a few tens of microseconds each instead of a
    thread's turn, and never queues ahead of other tenants' calls."""
    slots = _REQUESTS
    if slots is None or not slots.full:
        return None  # nobody at their share: the usual case costs this test alone
    found = _headers(head, (b"authorization", b"accept-language"))
    scheme, _sep, raw = found.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    from tenants.models import cached_tenant_id  # noqa: PLC0415 - apps are loaded by now

    tenant_id = cached_tenant_id(raw.strip().decode("ascii", "replace"))
    if tenant_id is None or tenant_id not in slots.full:
        return None
    from eai.middleware import new_request_id  # noqa: PLC0415

    request_id = new_request_id()
    language = found.get(b"accept-language", b"").decode("latin-1")
    before, after = _early_body(request_language(_Meta(language)))
    body = before + request_id.encode() + after
    return (
        f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER_S}\r\n"
        f"X-Request-Id: {request_id}\r\n\r\n"
    ).encode("latin-1") + body


class _Meta:
    def __init__(self, language: str) -> None:
        self.META = {"HTTP_ACCEPT_LANGUAGE": language}


@functools.cache
def _early_body(language: str) -> tuple[bytes, bytes]:
    """The early 429's envelope in `language`, cut where its request id goes (rendered
    once: the two languages' messages cost more than the rest of the refusal)."""

    class _Bare:
        META = {"HTTP_ACCEPT_LANGUAGE": language}
        request_id = "@REQUEST_ID@"

    body = json.dumps(envelope(_Bare, rate_limited()), ensure_ascii=False).encode()
    before, _sep, after = body.partition(b"@REQUEST_ID@")
    return before, after


def _headers(head: bytes, names: tuple[bytes, ...]) -> dict[bytes, bytes]:
    found = {}
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if colon and name in names:
            found[name] = value.strip()
    return found


class _Releasing:
    """The app's response iterable; its close() also frees the slot (the server calls
    it once the response is written, or the connection is gone)."""

    def __init__(self, inner: Iterable[bytes], ticket: _Ticket) -> None:
        self.inner = inner
        self.ticket = ticket

    def __iter__(self):
        return iter(self.inner)

    def close(self) -> None:
        try:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()
        finally:
            self.ticket.release()


class RequestSlots:
    """WSGI middleware, outermost: every request but `/healthz` holds a slot of its
    owner while it is served (a keyed one from the moment its key is known), and a
    keyless request past the keyless share answers 429 at once, without running the
    app."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            return self.app(environ, start_response)
        slots = request_slots()
        scheme, _sep, raw = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and raw.lstrip().startswith("eai_"):
            ticket = _Ticket(slots, None)  # its tenant's slot, once the key is known
        elif slots.try_acquire(KEYLESS):
            ticket = _Ticket(slots, KEYLESS)
        else:
            return _refuse(environ, start_response)
        environ[_TICKET] = ticket
        try:
            result = self.app(environ, start_response)
        except BaseException:
            ticket.release()
            raise
        return _Releasing(result, ticket)


def _refuse(environ: dict[str, Any], start_response: Callable) -> list[bytes]:
    from eai.middleware import wsgi_error  # noqa: PLC0415 - it imports settings-bound parts

    return wsgi_error(environ, start_response, rate_limited())


class FairExecutor:
    """Threads for queued calls run in this process: at most `total` at once, at most
    `share` of them for one owner; the rest wait, each owner's in arrival order, and a
    freed thread goes to the next owner in turn that is under its share."""

    def __init__(self, total: int, share: int, name: str = "eai-exec") -> None:
        self.total = total
        self.share = share
        self.name = name
        self._lock = threading.Lock()
        self._running: dict[Any, int] = {}
        self._waiting: dict[Any, deque[Callable[[], None]]] = {}
        self._turns: deque[Any] = deque()  # owners with waiting jobs, round robin
        self._busy = 0

    def submit(self, owner: Any, job: Callable[[], None]) -> None:
        with self._lock:
            self._waiting.setdefault(owner, deque()).append(job)
            if owner not in self._turns:
                self._turns.append(owner)
            start = self._busy < self.total
            if start:
                self._busy += 1
        if start:
            threading.Thread(target=self._work, name=self.name, daemon=True).start()

    def _next(self) -> tuple[Any, Callable[[], None]] | None:
        """The next job any owner under its share may run (lock held)."""
        for _ in range(len(self._turns)):
            owner = self._turns.popleft()
            jobs = self._waiting[owner]
            if self._running.get(owner, 0) >= self.share:
                self._turns.append(owner)
                continue
            job = jobs.popleft()
            if jobs:
                self._turns.append(owner)
            else:
                del self._waiting[owner]
            self._running[owner] = self._running.get(owner, 0) + 1
            return owner, job
        return None

    def _work(self) -> None:
        while True:
            with self._lock:
                found = self._next()
                if found is None:
                    self._busy -= 1  # the thread ends; a later submit starts another
                    return
            owner, job = found
            try:
                job()
            except Exception:  # the thread goes on to the next job
                logger.exception("a queued job failed")
            finally:
                with self._lock:
                    left = self._running[owner] - 1
                    if left:
                        self._running[owner] = left
                    else:
                        del self._running[owner]

    def running(self, owner: Any) -> int:
        with self._lock:
            return self._running.get(owner, 0)
