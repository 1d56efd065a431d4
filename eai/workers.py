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

import contextlib
import errno
import os
import queue
import re
import selectors
import socket
import ssl
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any

from gunicorn import util as gunicorn_util
from gunicorn.http import parser as gunicorn_parser
from gunicorn.http.unreader import SocketUnreader
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import (
    STOP_KEEPALIVE_LINGER,
    PollableMethodQueue,
    TConn,
    ThreadWorker,
)

_Job = tuple[Future, Any, tuple, dict]


def write_envelope_error(
    sock: socket.socket, status: int, reason: str, mesg: str, accept_language: str = ""
) -> None:
    """gunicorn's answer to a request it refuses before any application code runs (a
    request line over 4094 bytes: 414; header fields too large: 431; malformed HTTP:
    400), as the API's error envelope instead of gunicorn's HTML page. `message` follows
    `accept_language` when the head could be read (the event loop's 408), else English;
    `message_i18n` carries both."""
    from django.utils.translation import gettext_lazy as _  # noqa: PLC0415

    from eai.errors import ApiError, Text  # noqa: PLC0415 - Django is set up

    if status >= 500 and status != 501:
        error = ApiError("internal_error", status=status)
    else:  # 501: a transfer coding gunicorn does not know, the client's doing too
        why = {
            408: _("it was not received in time"),
            414: _("its request line is too long"),
            431: _("its header fields are too large"),
            417: _("its Expect header cannot be met"),
            403: _("it was refused before reaching the gateway"),
            501: _("it uses a transfer coding that is not supported"),
        }.get(status, _("it is not valid HTTP"))
        if mesg == "short_body":  # from the read-ahead, not gunicorn's parser
            why = _("its body ended before its Content-Length")
        error = ApiError("invalid_request", status=status, reason=Text(why))

    gunicorn_util.write_nonblock(sock, _envelope_answer(status, reason, error, accept_language))


def _envelope_answer(status: int, reason: str, error: Any, accept_language: str) -> bytes:
    """A whole HTTP/1.1 answer (closing the connection) carrying `error`'s envelope, its
    `message` in the language `accept_language` prefers (SPEC §3)."""
    import json  # noqa: PLC0415 - only on these rare paths

    from eai.errors import envelope, request_language  # noqa: PLC0415 - Django is set up
    from eai.middleware import new_request_id  # noqa: PLC0415

    class _Unparsed:  # what envelope() reads of a request
        META = {"HTTP_ACCEPT_LANGUAGE": accept_language}
        request_id = new_request_id()

    body = json.dumps(envelope(_Unparsed, error), ensure_ascii=False).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Content-Language: {request_language(_Unparsed)}\r\n"
        f"X-Request-Id: {_Unparsed.request_id}\r\n\r\n"
    )
    return head.encode("latin-1") + body


_ACCEPT_LANGUAGE = re.compile(rb"\r\naccept-language:[ \t]*([^\r\n]*)", re.IGNORECASE)


def _accept_language(head: bytes | bytearray) -> str:
    """The Accept-Language of a raw request head ('' without one)."""
    end = head.find(b"\r\n\r\n", 0, _HEAD_MAX)
    found = _ACCEPT_LANGUAGE.search(head, 0, _HEAD_MAX if end < 0 else end)
    return found.group(1).decode("latin-1").strip()[:256] if found else ""


_GUNICORN_WRITE_ERROR = gunicorn_util.write_error


# The Accept-Language of the request each connection's parser was handed (read ahead on
# the event loop): gunicorn's refusals name the socket only.
_LANGUAGES: weakref.WeakKeyDictionary[socket.socket, str] = weakref.WeakKeyDictionary()


def _write_error(sock: socket.socket, status: int, reason: str, mesg: str) -> None:
    try:
        write_envelope_error(sock, status, reason, mesg, _LANGUAGES.get(sock, ""))
    except Exception:  # an app other than the gateway's (no Django): gunicorn's page
        _GUNICORN_WRITE_ERROR(sock, status, reason, mesg)


# Request slots of this process (the threads that serve requests), set by gunicorn's
# worker classes (None: no bound from them, as under the test client). A long poll
# holds its thread for its whole wait: `gateway.views` lets long polls hold all but
# one, and `eai.bulkheads` gives each tenant at most its share of them.
REQUEST_THREADS: int | None = None

# How long an idle keep-alive connection is kept unless `--keep-alive` says otherwise.
KEEPALIVE_S = 10

# A request must fit in this many bytes of head (gunicorn's own limits are lower: past
# them its parser answers 414/431, which the read-ahead lets it do).
_HEAD_MAX = 64 * 1024
# How long a closing connection may drain what its client still sends (as gunicorn's
# close_graceful does), on the poller rather than in a thread.
_LINGER_S = 2.0
_LINGER_MAX = 64 * 1024
# What a body refused for its size may still send, read and discarded after the 413,
# for at most this many such connections at once (the others linger as any close does).
_TOO_LARGE_DRAIN = 64 * 1024 * 1024
_LONG_DRAINS_MAX = 64
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _limits() -> tuple[float, float, int]:
    """(header timeout, body timeout, body limit) from the settings, or defaults for an
    app that is not the gateway's."""
    try:
        from django.conf import settings  # noqa: PLC0415 - loaded with the app

        return (
            float(settings.EAI_HEADER_TIMEOUT_S),
            float(settings.EAI_BODY_TIMEOUT_S),
            int(settings.EAI_MAX_REQUEST_BYTES),
        )
    except Exception:
        return 10.0, 15.0, 1024 * 1024


class DeadlineUnreader(SocketUnreader):
    """gunicorn's socket reader with a deadline: a request's head must arrive within
    the header timeout and its body within the body timeout after that, however the
    client spaces its bytes (a per-read timeout would let one byte every few seconds
    through). Past it, TimeoutError. Reads that find data waiting cost what they did."""

    header_timeout = 10.0
    body_timeout = 15.0

    def __init__(self, sock: Any, max_chunk: int = 8192) -> None:
        super().__init__(sock, max_chunk)
        self.deadline = time.monotonic() + self.header_timeout

    def expect_head(self) -> None:
        self.deadline = time.monotonic() + self.header_timeout

    def expect_body(self) -> None:
        self.deadline = time.monotonic() + self.body_timeout

    def chunk(self, size_hint: int | None = None) -> bytes:
        size = self.mxchunk
        if size_hint and size_hint > size:
            size = min(size_hint, self.max_body_chunk)
        sock = self.sock
        if not isinstance(sock, ssl.SSLSocket):
            try:
                return sock.recv(size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
        remaining = self.deadline - time.monotonic()
        before = sock.gettimeout()
        if before is not None and before < remaining:
            remaining = before  # a caller's own bound (gunicorn's body drain) is shorter
        if remaining <= 0:
            raise TimeoutError("the client sent its request too slowly")
        sock.settimeout(remaining)
        try:
            return sock.recv(size)
        finally:
            sock.settimeout(before)


class _Reading:
    """A request being read on the poller: the bytes so far and its deadline."""

    __slots__ = ("body_bytes", "buf", "chunked", "deadline", "end", "head_end", "pos")

    def __init__(self, buf: bytes, deadline: float) -> None:
        self.buf = bytearray(buf)
        self.deadline = deadline
        self.head_end = 0  # where its head ends, once it is in
        self.end: int | None = None  # where its body ends, once that is known
        self.chunked = False
        self.pos = 0  # a chunked body: where its next chunk begins
        self.body_bytes = 0  # a chunked body: its data so far


class _GatewayWorker:
    """Worker mixin for the gateway's two worker classes.

    - gunicorn's own refusals answer with the envelope (above);
    - a request reaches a thread only whole: its head and its body (a declared length
      or chunked, within EAI_MAX_REQUEST_BYTES) are read on the event loop first,
      without blocking; a client that takes longer than EAI_HEADER_TIMEOUT_S for its
      head or EAI_BODY_TIMEOUT_S more for its body gets 408 and is closed, and one that
      half-closes before the end of its body gets 400. A trickling client then holds
      a connection, never a thread (gunicorn reads a request in the thread that serves
      it: two clients sending a byte a second froze two `InlineWorker` processes);
    - a body over the limit answers 413 from the event loop, unread (and uninvited
      under `Expect: 100-continue`, which the loop answers itself otherwise);
    - what is not read ahead (TLS, framing the parser refuses) is read in the thread
      under the same deadlines (`DeadlineUnreader`);
    - a tenant at its share of the process is answered 429 from the event loop when its
      key is cached here (`eai.bulkheads.early_refusal`);
    - a connection closed after its answer drains its client's last bytes on the
      poller (gunicorn lingered up to 2 s in the event loop's thread).
    """

    def request_threads(self) -> int:
        return self.cfg.threads  # type: ignore[attr-defined]

    def init_process(self) -> None:
        global REQUEST_THREADS
        # gunicorn's Worker.handle_error writes through gunicorn.util.write_error; this
        # process serves the API only, so every such answer becomes the envelope.
        gunicorn_util.write_error = _write_error
        gunicorn_parser.SocketUnreader = DeadlineUnreader
        REQUEST_THREADS = self.request_threads()
        keepalive = self.cfg.settings["keepalive"]  # type: ignore[attr-defined]
        if keepalive.value == keepalive.default:
            # gunicorn's 2 s closes an idle connection while clients still count on it:
            # Node's fetch keeps one 4 s, httpx 5 s, and a request sent on a connection the
            # server is closing fails (a stale-socket error, retried by few clients).
            # Past their idle timeouts, the client always closes first.
            self.cfg.set("keepalive", KEEPALIVE_S)  # type: ignore[attr-defined]
        self._reading: dict[Any, _Reading] = {}
        self._lingering: dict[Any, float] = {}
        self._long_drains = 0  # of them, bodies refused for their size (`_too_large`)
        self._accept_paused_until = 0.0
        self._swept = 0.0
        super().init_process()  # type: ignore[misc]

    def load_wsgi(self) -> None:
        super().load_wsgi()  # type: ignore[misc]
        header, body, limit = _limits()  # the app, and with it the settings, is loaded
        DeadlineUnreader.header_timeout = header
        DeadlineUnreader.body_timeout = body
        self._body_limit = limit
        try:
            from eai.bulkheads import early_refusal  # noqa: PLC0415 - the gateway's app only

            self._early = early_refusal
        except Exception:  # another WSGI app than the gateway's
            self._early = None

    # -- whole requests only -------------------------------------------------------

    def _reads_ahead(self, conn: Any) -> bool:
        return not self.cfg.is_ssl and not negotiation.prior_knowledge_allowed(  # type: ignore[attr-defined]
            self.cfg,
            conn.client,  # type: ignore[attr-defined]
        )

    def set_accept_enabled(self, enabled: bool) -> None:
        """gunicorn's loop turns accepting on below `worker_connections` connections:
        closing ones still draining (`linger`) hold a descriptor each and count too, so
        a flood of refused bodies cannot open connections past it; and none is taken
        for a moment after the process ran out of descriptors."""
        if enabled and (
            self.nr_conns + len(self._lingering) >= self.worker_connections  # type: ignore[attr-defined]
            or time.monotonic() < self._accept_paused_until
        ):
            enabled = False
        super().set_accept_enabled(enabled)  # type: ignore[misc]

    def accept(self, listener: socket.socket) -> None:
        if self.nr_conns + len(self._lingering) >= self.worker_connections:  # type: ignore[attr-defined]
            self.set_accept_enabled(False)  # the loop asks again; see set_accept_enabled
            return
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno in _OUT_OF_DESCRIPTORS:
                # Out of file descriptors: the connections held now must end before any
                # other is taken (it waits in the listen backlog). Raising killed the
                # worker and every call it served; retrying at once would spin.
                self._accept_paused_until = time.monotonic() + 0.1
                self.set_accept_enabled(False)  # type: ignore[attr-defined]
                return
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1  # type: ignore[attr-defined]
        conn = _Conn(self, self.cfg, client_sock, client_addr, listener.getsockname())  # type: ignore[attr-defined]
        self.enqueue_req(conn)

    def enqueue_req(self, conn: Any) -> None:
        """Every path by which gunicorn hands on a connection (a new one, a kept-alive
        one readable again, a pipelined request left in its buffer) comes here."""
        if not self._reads_ahead(conn):
            conn.sock.setblocking(True)
            self.dispatch(conn)
            return
        buffered = b""
        if conn.parser is not None:  # a pipelined request, after one served in a thread
            buffered = conn.parser.unreader.take_buffered()
            conn.sock.setblocking(False)  # the loop must never wait on a client
        self._reading[conn] = _Reading(buffered, time.monotonic() + DeadlineUnreader.header_timeout)
        if buffered and self._complete(conn):
            return
        self._read_some(conn, registered=False)

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        # A kept-alive connection: its next request has begun. Its poller entry stays
        # (modify() changes only the callback: no system call) until the request is whole.
        self.keepalived_conns.remove(conn)  # type: ignore[attr-defined]
        self._reading[conn] = _Reading(b"", time.monotonic() + DeadlineUnreader.header_timeout)
        self._read_some(conn, registered=True)

    def _on_readable(self, conn: Any, _client: Any) -> None:
        self._read_some(conn, registered=True)

    def _read_some(self, conn: Any, *, registered: bool) -> None:
        reading = self._reading[conn]
        for _ in range(64):  # at most 4 MiB a turn, then the other connections' turn
            try:
                data = conn.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                self._drop(conn, registered)
                return
            if not data:
                if reading.head_end:  # a head, then less body than it declared
                    self._answer(conn, 400, "Bad Request", "short_body")
                self._drop(conn, registered)
                return
            reading.buf += data
            if self._complete(conn, registered=registered):
                return
        if registered:
            self.poller.modify(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))  # type: ignore[attr-defined]
        else:
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))  # type: ignore[attr-defined]

    def _complete(self, conn: Any, *, registered: bool = False) -> bool:
        """Whether the request read so far is whole (or for the thread to read on, or
        for the parser to refuse); if so it is answered or handed on."""
        reading = self._reading[conn]
        if not reading.head_end:
            head_end = reading.buf.find(b"\r\n\r\n")
            if head_end < 0:
                if len(reading.buf) <= _HEAD_MAX:
                    return False
                return self._hand_on(conn, registered)  # the parser answers 431
            kind, length, expects = _framing(bytes(reading.buf[:head_end]))
            if kind == "thread":
                # An unknown coding or framing the parser refuses: the thread's, under
                # DeadlineUnreader's deadlines.
                return self._hand_on(conn, registered)
            if length > self._body_limit:
                return self._too_large(conn, registered)  # never invited, if it asked
            if expects:
                # The client waits to be invited: here, so its body is read ahead too
                # (gunicorn would invite it in the thread, and wait for it there).
                try:
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError:
                    self._drop(conn, registered)
                    return True
                conn.continued = True
            reading.head_end = head_end + 4
            reading.deadline = time.monotonic() + DeadlineUnreader.body_timeout
            if kind == "chunked":
                reading.chunked, reading.pos = True, head_end + 4
            else:
                reading.end = head_end + 4 + length
        if reading.end is None:
            end = _chunks_end(reading, self._body_limit)
            if end is None:
                return False
            if end == _TOO_LARGE:
                return self._too_large(conn, registered)
            if end == _MALFORMED:
                return self._hand_on(conn, registered)  # the parser answers 400
            reading.end = end
        if len(reading.buf) < reading.end:
            return False
        return self._hand_on(conn, registered)

    def _too_large(self, conn: Any, registered: bool) -> bool:
        """413 from the event loop, in no thread (a large body sent slowly held one while
        the app read it to answer). A body under `Expect: 100-continue` is never invited;
        one already on its way is read and discarded on the poller after the answer
        (SPEC §4), up to its declared length or `_TOO_LARGE_DRAIN` bytes within the body
        timeout: a client that writes its whole body before it reads (Python's
        http.client, most SDKs) gets the 413 rather than a broken pipe."""
        reading = self._reading.pop(conn, None)
        if registered:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)  # type: ignore[attr-defined]
        self.nr_conns -= 1  # type: ignore[attr-defined]
        buf = reading.buf if reading is not None else b""
        head_end = buf.find(b"\r\n\r\n")
        head = bytes(buf[: max(head_end, 0)])
        try:
            _write_too_large(conn.sock, self._body_limit, _accept_language(head))
        except OSError:
            conn.close()
            return True
        kind, length, expects = _framing(head) if head_end >= 0 else ("thread", 0, False)
        if expects and not getattr(conn, "continued", False):
            self.linger(conn)  # no body is coming: it waits for an invitation
            return True
        if self._long_drains >= _LONG_DRAINS_MAX:
            self.linger(conn)  # enough long drains at once: the short one
            return True
        sent = len(buf) - (head_end + 4)
        left = length - sent if kind == "length" else _TOO_LARGE_DRAIN
        self.linger(conn, drain=min(max(left, 0), _TOO_LARGE_DRAIN) + _LINGER_MAX,
                    seconds=DeadlineUnreader.body_timeout)  # fmt: skip
        if conn in self._lingering:
            conn.long_drain = True
            self._long_drains += 1
        return True

    def _hand_on(self, conn: Any, registered: bool) -> bool:
        reading = self._reading.pop(conn)
        if reading.end is not None and self._early is not None:
            answer = self._early(bytes(reading.buf[: reading.head_end - 4]))
            if answer is not None:
                self._answer_here(conn, reading, answer, registered)
                return True
        if registered:
            self.poller.unregister(conn.sock)  # type: ignore[attr-defined]
        conn.sock.setblocking(True)
        conn.data_ready = True
        try:
            conn.init()  # the parser (no TLS here), to hold what was read
        except Exception:
            self.nr_conns -= 1  # type: ignore[attr-defined]
            conn.close()
            return True
        conn.parser.unreader.unread(bytes(reading.buf))
        language = _accept_language(reading.buf)
        if language:
            _LANGUAGES[conn.sock] = language
        else:
            _LANGUAGES.pop(conn.sock, None)
        self.dispatch(conn)
        return True

    def _answer_here(self, conn: Any, reading: _Reading, answer: bytes, registered: bool) -> None:
        """Answer a whole request from the event loop (the early 429 of
        `eai.bulkheads.early_refusal`), then keep the connection for the next one."""
        head = bytes(reading.buf[: reading.head_end - 4]).lower()
        keep = (
            self.alive  # type: ignore[attr-defined]
            and len(reading.buf) == reading.end  # nothing pipelined behind it
            and head.split(b"\r\n", 1)[0].endswith(b"http/1.1")
            and b"connection: close" not in head
        )
        try:
            sent = conn.sock.send(answer)
        except OSError:
            sent = -1
        if sent != len(answer) or not keep:
            if registered:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self.poller.unregister(conn.sock)  # type: ignore[attr-defined]
            self.nr_conns -= 1  # type: ignore[attr-defined]
            if sent == len(answer):
                self.linger(conn)
            else:
                conn.close()
            return
        conn.set_timeout()
        self.keepalived_conns.append(conn)  # type: ignore[attr-defined]
        readable = partial(self.on_client_socket_readable, conn)  # type: ignore[attr-defined]
        if registered:
            self.poller.modify(conn.sock, selectors.EVENT_READ, readable)  # type: ignore[attr-defined]
        else:
            self.poller.register(conn.sock, selectors.EVENT_READ, readable)  # type: ignore[attr-defined]

    def _drop(self, conn: Any, registered: bool) -> None:
        self._reading.pop(conn, None)
        if registered:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)  # type: ignore[attr-defined]
        self.nr_conns -= 1  # type: ignore[attr-defined]
        conn.close()

    def _answer(self, conn: Any, status: int, reason: str, why: str) -> None:
        reading = self._reading.get(conn)
        language = _accept_language(reading.buf) if reading is not None else ""
        # Best effort: a client gone, or whose window is full, is closed all the same.
        with contextlib.suppress(Exception):
            write_envelope_error(conn.sock, status, reason, why, language)

    def murder_pending(self) -> None:
        super().murder_pending()  # type: ignore[misc]
        now = time.monotonic()
        if now - self._swept < 0.25:
            return
        self._swept = now
        for conn, reading in list(self._reading.items()):
            if reading.deadline <= now:
                self._answer(conn, 408, "Request Timeout", "too_slow")
                self._drop(conn, registered=True)
        for conn, deadline in list(self._lingering.items()):
            if deadline <= now:
                self._end_linger(conn)

    # -- closing without blocking the loop ------------------------------------------

    def linger(self, conn: Any, drain: int = _LINGER_MAX, seconds: float = _LINGER_S) -> None:
        """Half-close, then drain what the client still sends on the poller, `drain`
        bytes and `seconds` at most (RFC 9112 §9.6: so the answer is not cut by a reset)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._drain, conn))  # type: ignore[attr-defined]
        except (OSError, ValueError, KeyError):
            gunicorn_util.close(conn.sock)
            return
        self._lingering[conn] = time.monotonic() + seconds
        conn.drained = 0
        conn.drain_max = drain

    def _drain(self, conn: Any, _client: Any) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        conn.drained += len(data)
        if not data or conn.drained > conn.drain_max:
            self._end_linger(conn)

    def _end_linger(self, conn: Any) -> None:
        if self._lingering.pop(conn, None) is not None and getattr(conn, "long_drain", False):
            conn.long_drain = False
            self._long_drains -= 1
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)  # type: ignore[attr-defined]
        gunicorn_util.close(conn.sock)

    # -- in the serving thread -------------------------------------------------------

    def handle(self, conn: Any) -> Any:
        if conn.parser is not None and hasattr(conn.parser.unreader, "expect_head"):
            conn.parser.unreader.expect_head()  # a kept-alive connection's next request
        return super().handle(conn)  # type: ignore[misc]

    def handle_request(self, req: Any, conn: Any) -> bool:
        """The head is in: the body's deadline starts; `Expect: 100-continue` over the
        limit is refused before gunicorn invites the body."""
        unreader = conn.parser.unreader
        if hasattr(unreader, "expect_body"):
            unreader.expect_body()
        if getattr(conn, "continued", False):
            req._expected_100_continue = False  # invited by the event loop already
            conn.continued = False
        elif req._expected_100_continue and _request_length(req) > self._body_limit:
            language = next((v for n, v in req.headers if n == "ACCEPT-LANGUAGE"), "")
            _write_too_large(conn.sock, self._body_limit, language)
            return False
        return super().handle_request(req, conn)  # type: ignore[misc]

    def dispatch(self, conn: Any) -> None:
        raise NotImplementedError


class _Conn(TConn):
    """gunicorn's connection, whose graceful close lingers on the worker's poller."""

    def __init__(self, worker: _GatewayWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker
        self.drained = 0
        self.continued = False  # `100 Continue` sent by the event loop

    def close(self, graceful: bool = False) -> None:
        if graceful:
            self.worker.linger(self)
        else:
            gunicorn_util.close(self.sock)


def _framing(head: bytes) -> tuple[str, int, bool]:
    """How a request head says its body ends, ("length", n) (0 without a body) or
    ("chunked", 0), and whether it waits for `100 Continue`; ("thread", 0, False) when
    its body is not for the event loop to read: another coding or expectation, HTTP/1.0
    asking to be invited, or framing the parser refuses."""
    length: int | None = None
    chunked = expects = False
    lines = head.split(b"\r\n")
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == b"expect":
            if value.strip().lower() != b"100-continue" or not lines[0].endswith(b"HTTP/1.1"):
                return "thread", 0, False
            expects = True
        elif name == b"transfer-encoding":
            if value.strip().lower() != b"chunked" or chunked:
                return "thread", 0, False
            chunked = True
        elif name == b"content-length":
            value = value.strip()
            if not value.isdigit() or len(value) > 15 or length is not None:
                return "thread", 0, False
            length = int(value)
    if chunked:
        return ("thread", 0, False) if length is not None else ("chunked", 0, expects)
    return "length", length or 0, expects


_TOO_LARGE, _MALFORMED = -1, -2
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


def _chunks_end(reading: _Reading, limit: int) -> int | None:
    """Where a chunked body read so far ends (its trailers included), None while it is
    incomplete, _TOO_LARGE past `limit` bytes of data, _MALFORMED for the parser to
    refuse. Goes on from the last whole chunk it saw, so a body that arrives in many
    pieces is scanned once."""
    buf = reading.buf
    while True:
        line_end = buf.find(b"\r\n", reading.pos)
        if line_end < 0:
            return _MALFORMED if len(buf) - reading.pos > 4096 else None
        size_text = bytes(buf[reading.pos : line_end]).split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size_text):
            return _MALFORMED
        size = int(size_text, 16)
        if size == 0:  # the last chunk; trailer fields, then an empty line
            if buf[line_end + 2 : line_end + 4] == b"\r\n":
                return line_end + 4
            trailers_end = buf.find(b"\r\n\r\n", line_end)
            if trailers_end < 0:
                return _MALFORMED if len(buf) - line_end > _HEAD_MAX else None
            return trailers_end + 4
        if reading.body_bytes + size > limit:
            return _TOO_LARGE
        data_end = line_end + 2 + size
        if len(buf) < data_end + 2:
            return None
        if buf[data_end : data_end + 2] != b"\r\n":
            return _MALFORMED
        reading.pos = data_end + 2
        reading.body_bytes += size


def _request_length(req: Any) -> int:
    for name, value in req.headers:
        if name == "CONTENT-LENGTH":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _write_too_large(sock: socket.socket, limit: int, accept_language: str = "") -> None:
    """413 `payload_too_large` with the envelope (the body, if any, is drained after)."""
    from eai.errors import ApiError  # noqa: PLC0415 - Django is set up

    error = ApiError("payload_too_large", limit=limit)
    answer = _envelope_answer(413, "Content Too Large", error, accept_language)
    gunicorn_util.write(sock, answer)


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


class LifoThreadWorker(_GatewayWorker, ThreadWorker):
    """gunicorn's `gthread` worker with the pool above, whole requests only (above)."""

    def get_thread_pool(self) -> LifoExecutor:
        return LifoExecutor(max_workers=self.cfg.threads)

    def dispatch(self, conn: Any) -> None:
        ThreadWorker.enqueue_req(self, conn)


class _InlinePool(Executor):
    """No threads: the pool slot of gthread, which `InlineWorker` never uses."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        raise RuntimeError("InlineWorker runs requests in its own threads")


class _LeaderQueue(PollableMethodQueue):
    """gthread's queue of callbacks for the event loop, run by the loop's current
    thread only: one that hands the loop on stops running them."""

    def __init__(self, worker: InlineWorker) -> None:
        super().__init__()
        self.worker = worker

    def run_callbacks(self, _fileobj: Any, max_callbacks: int = 50) -> None:
        try:
            data = os.read(self._read_fd, max_callbacks)
        except OSError:
            return
        for _ in range(len(data) + 10):
            if not self.worker.leading():
                return  # the wake-up bytes are read: the new leader drains the rest
            try:
                callback = self._queue.get_nowait()
            except queue.Empty:
                return
            callback()
        if not self._queue.empty():
            self.worker.method_queue.defer(lambda: None)  # the rest, on the next turn


_DEFAULT_SLOTS = 16


class InlineWorker(_GatewayWorker, ThreadWorker):
    """Requests served in the event loop's own thread, handed to no pool; and the loop
    handed to another thread when a request holds it too long.

    gunicorn's `sync` worker closes the connection after every response, so each call
    pays a TCP handshake, an `accept` and a teardown on both ends. `gthread` keeps
    connections alive but hands every request from its event loop to a pool thread and
    back through a pipe: two thread switches a request. This worker keeps gthread's event
    loop (keep-alive, idle and pending connections on the poller, their timeouts,
    graceful stop) and runs each request in the loop's thread, the leader.

    Served that way alone, one slow request held the whole process (two slow calls of
    one tenant froze `-w 2`). So the loop's threads are leaders and followers: when the
    leader has been in one request for HANDOFF_S (a watchdog looks twice as often while
    requests come, every IDLE_LOOK_S after an idle second), a
    follower (an idle thread, the last to go idle first, or a new one) takes over the
    event loop, and the old leader finishes its request as a plain request thread, then
    waits as a follower. At most `--threads` requests are served at once (16 when
    `--threads` is not given: the process's request slots, of which `eai.bulkheads`
    gives one tenant half); past that a whole request waits for a slot. A call that
    answers within HANDOFF_S, nearly all of them, never leaves the thread that read it,
    so a process serves fast calls as the one-request-at-a-time version did; a slow
    upstream, a long poll, a slow query costs one hand-off of the loop after HANDOFF_S.

    Measured on the 2-core bench machine, `POST /v1/tools/echo/invoke` under
    `-w 2`: c=1 p50 3.4-4.1 -> 2.6-2.8 ms, c=16 (16 clients) +10-13 % calls/s over `sync`
    (BENCHMARKS.md, fifth pass). `gunicorn eai.wsgi -w 2 -k eai.workers.InlineWorker`.
    """

    HANDOFF_S = 0.02
    IDLE_LOOK_S = 0.1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.method_queue = _LeaderQueue(self)
        self.slots = self.cfg.threads if self.cfg.threads > 1 else _DEFAULT_SLOTS
        self._lock = threading.Lock()
        self._local = threading.local()
        self._leader: _Slot | None = None
        self._serving = False  # the leader is in a request (pipelined ones go round)
        self._since: float | None = None  # when the leader's request began
        self._busy = 0  # requests being served, the leader's included
        self._served = 0  # requests begun, for the watchdog's pace
        self._followers: list[_Slot] = []
        self._waiting: deque[Any] = deque()  # whole requests waiting for a slot
        self._stopped = threading.Event()
        self._main: _Slot | None = None  # the main thread's: its return ends the process

    def request_threads(self) -> int:
        return self.slots

    def get_thread_pool(self) -> _InlinePool:
        return _InlinePool()

    def leading(self) -> bool:
        return self._leader is getattr(self._local, "slot", None)

    # -- the loop, led by one thread at a time ---------------------------------------

    def run(self) -> None:
        self.poller.register(
            self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks
        )
        self.set_accept_enabled(True)
        slot = self._main = _Slot()
        self._leader = slot
        threading.Thread(target=self._watch, name="eai-watch", daemon=True).start()
        self._follow(slot)  # this thread (the main one) leads first

    def _follow(self, slot: _Slot) -> None:
        """A loop thread's life: lead while it is the leader, else wait to be one."""
        self._local.slot = slot
        while True:
            if self._leader is slot:
                self._lead(slot)
            if self._stopped.is_set():
                return
            with self._lock:
                if self._leader is slot:
                    continue
                if len(self._followers) >= self.slots and slot is not self._main:
                    return  # idle threads enough: this one ends (never the main one)
                slot.wake.clear()
                self._followers.append(slot)
            slot.wake.wait()

    def _lead(self, slot: _Slot) -> None:
        while self.alive and self._leader is slot:
            self.notify()
            can_accept = self.nr_conns < self.worker_connections
            if can_accept != self._accepting:
                self.set_accept_enabled(can_accept)
            self.wait_for_and_dispatch_events(timeout=1.0)
            if self._leader is not slot:
                return  # handed on while serving a request
            if not self.is_parent_alive():
                break
            self.murder_keepalived()
            self.murder_pending()
        if self._leader is slot:
            self._shut_down()

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        try:
            events = self.poller.select(timeout)
            for key, _ in events:
                key.data(key.fileobj)
                if not self.leading():
                    return  # the rest are the new leader's (the poller reports them again)
        except OSError as exc:
            if exc.errno != errno.EINTR:
                raise

    def _shut_down(self) -> None:
        """gthread's graceful stop, run by the leader of the moment."""
        self.set_accept_enabled(False)
        self._cap_keepalive(time.monotonic() + STOP_KEEPALIVE_LINGER)
        graceful_timeout = time.monotonic() + self.cfg.graceful_timeout
        while self.nr_conns > 0 and time.monotonic() <= graceful_timeout:
            self.notify()
            timeout = 1.0
            if self.keepalived_conns:
                timeout = min(timeout, max(self.keepalived_conns[0].timeout - time.monotonic(), 0))
            self.wait_for_and_dispatch_events(timeout=timeout)
            self.murder_keepalived()
            self.murder_pending()
        self.murder_keepalived(force=True)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()
        with self._lock:
            self._stopped.set()
            for follower in self._followers:
                follower.wake.set()

    def _watch(self) -> None:
        """Hands the loop on from a leader held by one request for HANDOFF_S, and tells
        the arbiter the process lives while the loop waits for a free slot. It looks
        every HANDOFF_S / 2 while requests come, every IDLE_LOOK_S after a second
        without any (each look takes the GIL: 100 a second cost an idle process 0.6 %
        of a core on the bench machine)."""
        beat = 0.0
        seen, active_until = -1, 0.0
        period = self.HANDOFF_S / 2
        while not self._stopped.wait(period):
            now = time.monotonic()
            with self._lock:
                since = self._since
                if self._served != seen or since is not None:
                    seen, active_until = self._served, now + 1.0
                period = self.HANDOFF_S / 2 if now < active_until else self.IDLE_LOOK_S
                if (
                    since is not None
                    and now - since >= self.HANDOFF_S
                    and self._busy < self.slots
                    and self.alive
                ):
                    self._since = None
                    self._serving = False  # the new leader is in no request
                    if self._followers:
                        follower = self._followers.pop()  # the last to go idle
                        self._leader = follower
                        follower.wake.set()
                    else:
                        follower = _Slot()
                        self._leader = follower
                        threading.Thread(
                            target=self._follow, args=(follower,), name="eai-loop", daemon=True
                        ).start()
            if since is not None and now - beat >= 1.0:
                self.notify()
                beat = now

    # -- serving --------------------------------------------------------------------

    def dispatch(self, conn: Any) -> None:
        """Serve a whole request here, in the leader's thread."""
        if self._serving:
            # finish_request() hands on a kept-alive connection again at once when the
            # client pipelined its next request. Going back through the event loop
            # rather than serving it here keeps the stack flat, lets the other clients
            # take their turn, and keeps the heartbeat to the arbiter going.
            self.method_queue.defer(self.dispatch, conn)
            return
        with self._lock:
            if self._busy >= self.slots:
                self._waiting.append(conn)
                return
            self._busy += 1
            self._served += 1
            self._since = time.monotonic()
            self._serving = True
        slot = self._local.slot
        try:
            result: Any = self.handle(conn)
        finally:
            with self._lock:
                self._busy -= 1
                leading = self._leader is slot
                if leading:
                    self._since = None
        done: Future = Future()
        done.set_result(result)
        if not leading:
            # Handed on meanwhile: the loop's structures are the new leader's.
            self.method_queue.defer(self._finished, conn, done)
            return
        try:
            self.finish_request(conn, done)
        finally:
            self._serving = False
        self._next_waiting()

    def _finished(self, conn: Any, done: Future) -> None:
        self.finish_request(conn, done)
        self._next_waiting()

    def _next_waiting(self) -> None:
        with self._lock:
            conn = self._waiting.popleft() if self._waiting and self._busy < self.slots else None
        if conn is not None:
            self.method_queue.defer(self.dispatch, conn)
