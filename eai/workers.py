"""gunicorn worker classes: `InlineWorker` for production (see below) and a threaded
worker whose requests go to the thread that went idle last, for `make run`.

gunicorn's `gthread` worker runs requests on a `ThreadPoolExecutor`, whose idle threads
wait on one queue: the thread idle the longest takes the next request, so successive
requests rotate through every thread. Each thread keeps its own database connection,
and a connection's caches (SQLite's page cache, dropped whenever another connection has
written; a PostgreSQL backend's plan and catalog caches) are cold on the next turn of
the rotation. Measured on the embedded SQLite default, one call at a time: 0.7–0.8 ms
more CPU a call with 16 threads in rotation than with the same thread each time.

`LifoThreadWorker` keeps gthread's behaviour in every other respect (the same number of
threads, waiting requests served in arrival order) but gives each request to the most
recently idle thread, so a lightly loaded server keeps reusing one warm thread and its
connection. `manage.py serve` (`make run`) uses it; for gunicorn itself:
`gunicorn eai.wsgi -k eai.workers.LifoThreadWorker --threads 4`.
"""

from __future__ import annotations

import socket
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Executor, Future
from typing import Any

from gunicorn import util as gunicorn_util
from gunicorn.workers.gthread import _DEFER, DEFAULT_WORKER_DATA_TIMEOUT, ThreadWorker

_Job = tuple[Future, Any, tuple, dict]


def write_envelope_error(sock: socket.socket, status: int, reason: str, mesg: str) -> None:
    """gunicorn's answer to a request it refuses before any application code runs (a
    request line over 4094 bytes: 414; header fields too large: 431; malformed HTTP:
    400), as the API's error envelope instead of gunicorn's HTML page. No header was
    read, so the message is in English; `message_i18n` carries both."""
    import json  # noqa: PLC0415 - only on this rare path

    from django.utils.translation import gettext_lazy as _  # noqa: PLC0415

    from eai.errors import ApiError, Text, envelope  # noqa: PLC0415 - Django is set up
    from eai.middleware import new_request_id  # noqa: PLC0415

    if status >= 500 and status != 501:
        error = ApiError("internal_error", status=status)
    else:  # 501: a transfer coding gunicorn does not know, the client's doing too
        why = {
            414: _("its request line is too long"),
            431: _("its header fields are too large"),
            417: _("its Expect header cannot be met"),
            403: _("it was refused before reaching the gateway"),
            501: _("it uses a transfer coding that is not supported"),
        }.get(status, _("it is not valid HTTP"))
        error = ApiError("invalid_request", status=status, reason=Text(why))

    class _Unparsed:  # what envelope() reads of a request
        META: dict[str, str] = {}
        request_id = new_request_id()

    body = json.dumps(envelope(_Unparsed, error), ensure_ascii=False).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"X-Request-Id: {_Unparsed.request_id}\r\n\r\n"
    )
    gunicorn_util.write_nonblock(sock, head.encode("latin-1") + body)


_GUNICORN_WRITE_ERROR = gunicorn_util.write_error


def _write_error(sock: socket.socket, status: int, reason: str, mesg: str) -> None:
    try:
        write_envelope_error(sock, status, reason, mesg)
    except Exception:  # an app other than the gateway's (no Django): gunicorn's page
        _GUNICORN_WRITE_ERROR(sock, status, reason, mesg)


# Request threads a long poll may take in this process, set by gunicorn's worker
# classes (None: no bound from them, as under the test client or `InlineWorker`, which
# gives long polls threads of their own). A long poll holds its thread for its whole
# wait: `gateway.views` lets long polls hold all but one, so others are still served.
REQUEST_THREADS: int | None = None
# The thread of an `InlineWorker`'s event loop (None elsewhere): a request served there
# holds the whole process, so a long poll that reaches it (one the peek missed: TLS, a
# request line past the peek) answers at once rather than wait.
INLINE_THREAD: int | None = None


class _EnvelopeErrors:
    """Worker mixin: gunicorn's own refusals answer with the envelope (above)."""

    def request_threads(self) -> int | None:
        return self.cfg.threads  # type: ignore[attr-defined]

    def init_process(self) -> None:
        global REQUEST_THREADS
        # gunicorn's Worker.handle_error writes through gunicorn.util.write_error; this
        # process serves the API only, so every such answer becomes the envelope.
        gunicorn_util.write_error = _write_error
        REQUEST_THREADS = self.request_threads()
        super().init_process()  # type: ignore[misc]


class _Slot:
    """One pool thread's mailbox: the job handed to it while it waits."""

    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.job: _Job | None = None
        self.wake = threading.Event()


class LifoExecutor(Executor):
    """At most `max_workers` threads, started on demand; a job goes to the thread that
    went idle last, or waits its turn (first in, first out) when all are busy."""

    def __init__(
        self, max_workers: int, thread_name_prefix: str = "eai-worker", wait_at_exit: bool = True
    ) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []  # a stack: the last to go idle is woken first
        self._waiting: deque[_Job] = deque()
        self._threads: list[threading.Thread] = []
        self._shutdown = False
        # As the stdlib pool does: at interpreter exit, let the running and waiting jobs
        # finish (the threads are daemons, so nothing else would wait for them).
        if wait_at_exit:
            pool = weakref.ref(self)
            threading._register_atexit(lambda: (p := pool()) is not None and p.shutdown(wait=True))

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        job = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                slot = self._idle.pop()
                slot.job = job
                slot.wake.set()
            elif len(self._threads) < self._max_workers:
                slot = _Slot()
                slot.job = job
                thread = threading.Thread(
                    target=self._work,
                    args=(slot,),
                    name=f"{self._prefix}_{len(self._threads)}",
                    daemon=True,
                )
                thread.start()  # counted only once it runs
                self._threads.append(thread)
            else:
                self._waiting.append(job)
        return future

    def _work(self, slot: _Slot) -> None:
        job, slot.job = slot.job, None  # the slot keeps no finished job alive
        while job is not None:
            future: Future | None
            future, fn, args, kwargs = job
            result: Any = None
            failed = False
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the future, as the stdlib pool does
                    result, failed = exc, True
            else:
                future = None  # cancelled while it waited
            # Go idle (or take the next waiting job) before the caller learns the result:
            # a caller that submits again at once then finds this thread, not a new one.
            with self._lock:
                idle = False
                if self._waiting:
                    job = self._waiting.popleft()
                elif self._shutdown:
                    job = None
                else:
                    job, slot.job, idle = None, None, True
                    slot.wake.clear()
                    self._idle.append(slot)
            if future is not None:
                if failed:
                    future.set_exception(result)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs, result  # no reference kept while idle
            if idle:
                slot.wake.wait()
                job, slot.job = slot.job, None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._waiting:
                    self._waiting.popleft()[0].cancel()
            idle, self._idle = self._idle, []
        for slot in idle:  # woken with no job: the thread ends
            slot.wake.set()
        if wait:
            for thread in list(self._threads):
                thread.join()


class LifoThreadWorker(_EnvelopeErrors, ThreadWorker):
    """gunicorn's `gthread` worker with the pool above."""

    def get_thread_pool(self) -> LifoExecutor:
        return LifoExecutor(max_workers=self.cfg.threads)


class _InlinePool(Executor):
    """No threads: the pool slot of gthread, which `InlineWorker` never uses."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        raise RuntimeError("InlineWorker runs requests in its own thread")


class InlineWorker(_EnvelopeErrors, ThreadWorker):
    """One request at a time, in the worker's own thread, on kept-alive connections.

    gunicorn's `sync` worker closes the connection after every response, so each call
    pays a TCP handshake, an `accept` and a teardown on both ends. `gthread` keeps
    connections alive but hands every request from its event loop to a pool thread and
    back through a pipe: two thread switches a request. This worker keeps gthread's event
    loop (keep-alive, idle and pending connections on the poller, their timeouts,
    graceful stop) and runs each request in the loop's thread. Like `sync`, a process
    serves one request at a time, so concurrency comes from `-w`, and a client that
    sends part of a request and stalls holds its process (`sync` has the same limit:
    serve behind a buffering proxy). A new connection whose request has not arrived yet
    waits on the poller, not in the worker, as long as gthread would let it wait.

    Measured on the 2-core bench machine, `POST /v1/tools/echo/invoke` under
    `-w 2`: c=1 p50 3.4-4.1 -> 2.6-2.8 ms, c=16 (16 clients) +10-13 % calls/s over `sync`.
    `gunicorn eai.wsgi -w 2 -k eai.workers.InlineWorker`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._serving = False
        self._long_polls: LifoExecutor | None = None

    def request_threads(self) -> int | None:
        global INLINE_THREAD
        INLINE_THREAD = threading.get_ident()  # called from init_process, in the loop's thread
        return None  # long polls have threads of their own (below)

    def get_thread_pool(self) -> _InlinePool:
        return _InlinePool()

    def _long_poll_pool(self) -> LifoExecutor:
        """Threads for `GET …/invocations/{id}?wait=`: served inline, one waiting client
        would hold the whole process (two of them, both workers of `-w 2`, and every
        tenant's calls stalled). Twice the slots `gateway.views` lets wait: the polls
        past them answer at once and need a thread only for that."""
        if self._long_polls is None:
            try:
                from django.conf import settings  # loaded with the app, after this module

                slots = max(1, int(settings.EAI_LONG_POLL_SLOTS))
            except Exception:  # another WSGI app than the gateway's: its default
                slots = 4
            # Not waited for at exit: a long poll may always end early, and a stopping
            # worker would otherwise wait out every client's `wait`.
            self._long_polls = LifoExecutor(
                max_workers=2 * slots, thread_name_prefix="eai-wait", wait_at_exit=False
            )
        return self._long_polls

    def enqueue_req(self, conn: Any) -> None:
        if not self._serving and _is_long_poll(conn.sock):
            # gthread's own path: a pool thread serves it, the loop goes on.
            future = self._long_poll_pool().submit(self.handle, conn)
            future.add_done_callback(
                lambda done: self.method_queue.defer(self.finish_request, conn, done)
            )
            return
        if self._serving:
            # finish_request() enqueues a kept-alive connection again at once when the
            # client pipelined its next request. Going back through the event loop
            # rather than serving it here keeps the stack flat, lets the other clients
            # take their turn, and keeps the heartbeat to the arbiter going.
            self.method_queue.defer(self.enqueue_req, conn)
            return
        self._serving = True
        try:
            if conn.initialized or conn.data_ready or _readable(conn.sock):
                result: Any = self.handle(conn)
            else:
                result = _DEFER  # finish_request() parks it on the poller
            done: Future = Future()
            done.set_result(result)
            self.finish_request(conn, done)
            if result is _DEFER and self.alive:
                # gthread parks a new connection only after waiting for its request
                # DEFAULT_WORKER_DATA_TIMEOUT in a pool thread, then gives it `keepalive`
                # more on the poller; this one is parked at once, so it gets both here.
                # Every parked connection gets the same offset: pending_conns stays sorted.
                conn.timeout = time.monotonic() + DEFAULT_WORKER_DATA_TIMEOUT + self.cfg.keepalive
        finally:
            self._serving = False


_LONG_POLL_PATH = b"/v1/tools/invocations/"


def _is_long_poll(sock: socket.socket) -> bool:
    """Whether the request waiting on `sock` is a `GET` of one invocation with `wait=`:
    its request line, peeked (nothing is consumed). Anything else, a TLS socket (no
    peeking there) included, is served inline."""
    try:
        head = sock.recv(512, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, ValueError):
        return False
    line = head.split(b"\r\n", 1)[0]
    return line.startswith(b"GET " + _LONG_POLL_PATH) and b"wait=" in line


def _readable(sock: socket.socket) -> bool:
    """Whether a request's first bytes (or the peer's close) wait on `sock`. Peeks, so
    nothing is consumed, and opens no selector: out of file descriptors, this must not
    fail where gthread's own wait would have failed inside its error handling."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True  # a reset or other error: handle() meets it and closes the connection
    return True
