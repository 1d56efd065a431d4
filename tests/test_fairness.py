"""One tenant can never slow another (SPEC §14): tenant A saturating its share of a
real gunicorn server (both postures: `make run`'s threaded worker and production's
`InlineWorker`) with slow calls, floods and trickling connections, while tenant B and
`/healthz` are still served; and the HTTP edge cases that would let a client hold or
fool the server (a body shorter than its length, `Expect: 100-continue` over the
limit)."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from eai import bulkheads
from gateway.manifests import apply_manifests
from gateway.models import Invocation
from tenants.scope import tenant_scope

from .conftest import tool_manifest

pytestmark = pytest.mark.django_db(transaction=True)

POSTURES = {
    # `make run`: one process, 16 threads (gateway/management/commands/serve.py)
    "embedded": ["-w", "1", "-k", "eai.workers.LifoThreadWorker", "--threads", "16"],
    # production (README): InlineWorker, its default 16 request slots
    "production": ["-w", "1", "-k", "eai.workers.InlineWorker"],
}


def _server_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "EAI_REDIS_URL": "", "EAI_BROKER_URL": "", "PYTHONUNBUFFERED": "1"}
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
        env["EAI_DATABASE_URL"] = (
            f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    else:
        env.pop("EAI_DATABASE_URL", None)
        env["EAI_SQLITE_PATH"] = db["NAME"]
    env.update(extra)
    return env


class Gateway:
    """The gateway under gunicorn on a free loopback port, in one posture."""

    def __init__(self, posture: str, **env: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        gunicorn = Path(sys.executable).parent / "gunicorn"
        self.proc = subprocess.Popen(
            [str(gunicorn), "eai.wsgi", *POSTURES[posture], "-b", f"127.0.0.1:{self.port}"]
            + ["--graceful-timeout", "2", "--timeout", "120"],
            cwd=settings.BASE_DIR,
            env=_server_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.get("/healthz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the gateway ({posture}) did not start")
            time.sleep(0.2)

    def request(self, method, path, body=None, headers=None, timeout=60.0):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read(), dict(response.getheaders())
        finally:
            conn.close()

    def get(self, path, headers=None, timeout=60.0):
        return self.request("GET", path, headers=headers, timeout=timeout)

    def invoke(self, raw_key, tool, tool_input=None, timeout=60.0, **headers):
        body = json.dumps({"input": tool_input or {}}).encode()
        headers = {
            "Authorization": f"Bearer {raw_key}",
            "Content-Type": "application/json",
            **{k.replace("_", "-"): v for k, v in headers.items()},
        }
        return self.request("POST", f"/v1/tools/{tool}/invoke", body, headers, timeout)

    def timed(self, call, *args, **kwargs):
        started = time.monotonic()
        result = call(*args, **kwargs)
        return time.monotonic() - started, result

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=10)


@pytest.fixture(params=list(POSTURES))
def posture(request):
    return request.param


def _slow_tool(api, upstream, name="slow.search", seconds=6, timeout_ms=30000):
    apply_manifests(
        tenant=api.key.tenant,
        documents=[
            tool_manifest(
                name,
                {
                    "type": "http",
                    "url": upstream.url(f"/slow?s={seconds}"),
                    "timeout_ms": timeout_ms,
                },
            )
        ],
    )


def _slow_calls(upstream) -> int:
    return len([c for c in upstream.calls if c["path"] == "/slow"])


def _wait_for(predicate, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_tenant_b_and_healthz_are_served_while_tenant_a_saturates_its_share(
    posture, alice, bob, upstream
):
    """Twenty concurrent calls of A to a tool that answers in 6 s: eight (A's half of
    16 slots) run, twelve answer 429 `rate_limited` with Retry-After at once, and B's
    call and /healthz answer as if A were not there."""
    _slow_tool(alice, upstream)
    gateway = Gateway(posture)
    try:
        with ThreadPoolExecutor(max_workers=24) as pool:
            langs = ["fr" if n % 2 else "en" for n in range(20)]
            attack = [
                pool.submit(
                    gateway.timed, gateway.invoke, alice.raw_key, "slow.search",
                    {"n": n}, Accept_Language=lang,
                )
                for n, lang in enumerate(langs)
            ]  # fmt: skip
            assert _wait_for(lambda: _slow_calls(upstream) >= 8, timeout=20)
            time.sleep(0.5)  # any call beyond the share would have reached the upstream
            assert _slow_calls(upstream) == 8
            # Meanwhile: B's call and the probe, A's saturation still on (6 s a call).
            b_time, (b_status, b_body, _h) = gateway.timed(
                gateway.invoke, bob.raw_key, "jira.search", {"q": "INC-1"}
            )
            h_time, (h_status, _b, _h) = gateway.timed(gateway.get, "/healthz")
            still_running = sum(not f.done() for f in attack)
            results = [f.result(timeout=60) for f in attack]
    finally:
        gateway.stop()
    assert b_status == 200 and json.loads(b_body)["status"] == "succeeded"
    assert h_status == 200
    # Generous margins: a stalled server made them wait out A's 6 s calls.
    assert b_time < 3.0 and h_time < 3.0, (b_time, h_time)
    assert still_running >= 8  # they were measured during the attack
    refused = [(elapsed, r) for (elapsed, r), lang in zip(results, langs, strict=True)
               if r[0] == 429]  # fmt: skip
    served = [r for _elapsed, r in results if r[0] == 200]
    assert len(served) == 8 and len(refused) == 12
    for elapsed, (_status, body, headers) in refused:
        assert elapsed < 3.0  # at once, not after waiting for a slot
        assert headers["Retry-After"] == "1"
        error = json.loads(body)["error"]
        assert error["code"] == "rate_limited"
        assert error["message_i18n"]["fr"].startswith("Trop de requêtes")
        assert error["message"] in (error["message_i18n"]["en"], error["message_i18n"]["fr"])
    french = [json.loads(r[1])["error"]["message"] for (_e, r), lang in zip(results, langs,
              strict=True) if r[0] == 429 and lang == "fr"]  # fmt: skip
    assert french and all(m.startswith("Trop de requêtes") for m in french)


def test_a_tenants_slots_come_back_after_timeouts_and_errors(posture, alice, bob, upstream):
    """Slots are released whatever the call's end: after eight calls that time out
    (504), eight that fail (502, or 503 once the breaker opens) and a burst of 401s,
    A again runs eight at once, and no more."""
    _slow_tool(alice, upstream, seconds=3, timeout_ms=1000)
    _slow_tool(alice, upstream, name="slow.ok", seconds=2)
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[tool_manifest("broken", {"type": "http", "url": upstream.url("/status/500")})],
    )
    gateway = Gateway(posture)
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            timeouts = list(pool.map(lambda _n: gateway.invoke(alice.raw_key, "slow.search"),
                                     range(8)))  # fmt: skip
            failures = list(pool.map(lambda _n: gateway.invoke(alice.raw_key, "broken"),
                                     range(8)))  # fmt: skip
            bad_keys = list(pool.map(lambda _n: gateway.invoke("eai_nope_nope", "broken"),
                                     range(16)))  # fmt: skip
            before = _slow_calls(upstream)
            again = list(pool.map(lambda _n: gateway.invoke(alice.raw_key, "slow.ok"), range(9)))
    finally:
        gateway.stop()
    assert [r[0] for r in timeouts] == [504] * 8
    assert {r[0] for r in failures} <= {502, 503}  # 503 once its breaker opens
    assert [r[0] for r in bad_keys] == [401] * 16
    assert sorted(r[0] for r in again) == [200] * 8 + [429]
    assert _slow_calls(upstream) - before == 8


def test_slow_headers_and_bodies_are_cut_off_and_hold_no_slot(posture, alice, bob):
    """Thirty-two connections trickle a byte a second (sixteen their head, sixteen their
    body, twice the request slots): B is served meanwhile, and each trickler gets 408
    and is closed past its deadline (2 s here), its request never run."""
    gateway = Gateway(posture, EAI_HEADER_TIMEOUT_S="2", EAI_BODY_TIMEOUT_S="2")
    body = json.dumps({"input": {"q": "INC-2"}}).encode()
    head = (
        f"POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {alice.raw_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    tricklers: list[socket.socket] = []
    verdicts: dict[int, bytes] = {}
    stop = threading.Event()

    def trickle(index: int, sock: socket.socket, data: bytes) -> None:
        got = b""
        sock.settimeout(0.05)
        for byte in data:
            if stop.is_set():
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    verdicts[index] = got
                    return
                got += chunk
        verdicts[index] = got + b"<still open>"

    try:
        threads = []
        for index in range(32):
            sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
            tricklers.append(sock)
            # Half send their head a byte a second; half their head at once, then the body.
            if index % 2:
                sock.sendall(head)
                data = body
            else:
                data = head + body
            threads.append(threading.Thread(target=trickle, args=(index, sock, data), daemon=True))
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        b_time, (b_status, _b, _h) = gateway.timed(
            gateway.invoke, bob.raw_key, "jira.search", {"q": "INC-3"}, timeout=10
        )
        h_time, (h_status, _b, _h) = gateway.timed(gateway.get, "/healthz", timeout=10)
        for thread in threads:
            thread.join(timeout=30)
    finally:
        stop.set()
        for sock in tricklers:
            sock.close()
        gateway.stop()
    assert b_status == 200 and h_status == 200
    assert b_time < 3.0 and h_time < 3.0, (b_time, h_time)
    assert len(verdicts) == 32
    for index, got in verdicts.items():
        assert got.startswith(b"HTTP/1.1 408 "), (index, got[:200])
        assert b'"code": "invalid_request"' in got and b"<still open>" not in got
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not Invocation.objects.for_tenant(alice.key.tenant).exists()


def _raw_exchange(port: int, data: bytes, *, half_close: bool, wait: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            got += b"<timed out>"
        return got


def test_a_body_shorter_than_its_length_then_a_half_close_is_refused(posture, alice, bob):
    """`{"input": {}}` is valid JSON on its own: sent with a Content-Length of 200, then
    a half-close, it was run. Now 400 in the envelope, and nothing is run."""
    gateway = Gateway(posture)
    part = b'{"input": {"q": "INC-4"}}'
    try:
        answers = [
            _raw_exchange(
                gateway.port,
                (
                    "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {alice.raw_key}\r\n"
                    f"Content-Type: application/json\r\nAccept-Language: {lang}\r\n"
                    "Content-Length: 200\r\n\r\n"
                ).encode() + part,
                half_close=True,
            )
            for lang in ("en", "fr")
        ]  # fmt: skip
        b_status, _b, _h = gateway.invoke(bob.raw_key, "jira.search", {"q": "INC-5"})
    finally:
        gateway.stop()
    for got in answers:
        head, _sep, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), got[:200]
        error = json.loads(body)["error"]
        assert error["code"] == "invalid_request"
        assert error["message_i18n"]["en"] == (
            "The request is invalid: its body ended before its Content-Length"
        )
        assert error["message_i18n"]["fr"] == (
            "La requête est invalide : son corps s’est terminé avant sa Content-Length"
        )
    assert b_status == 200
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not Invocation.objects.for_tenant(alice.key.tenant).exists()


def test_the_app_itself_refuses_a_short_body_whatever_server_runs_it(alice):
    """Under a server that passes a short body on (no read-ahead), the WSGI app checks
    the length itself."""
    from eai import wsgi

    part = b'{"input": {"q": "INC-6"}}'
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/tools/jira.search/invoke",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "HTTP_HOST": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "200",
        "HTTP_AUTHORIZATION": f"Bearer {alice.raw_key}",
        "HTTP_ACCEPT_LANGUAGE": "fr",
        "wsgi.input": io.BytesIO(part),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
    }
    answered = {}

    def start_response(status, headers):
        answered["status"], answered["headers"] = status, dict(headers)

    body = b"".join(wsgi.application(environ, start_response))
    assert answered["status"].startswith("400 ")
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith("La requête est invalide : son corps")
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not Invocation.objects.for_tenant(alice.key.tenant).exists()


def test_expect_100_continue_over_the_limit_gets_413_at_once(posture, alice):
    """The client waits for `100 Continue` before sending its 5 MiB: it gets 413 with
    the envelope instead, and is never invited to send the body."""
    gateway = Gateway(posture)
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(
                (
                    "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {alice.raw_key}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {5 * 1024 * 1024}\r\nExpect: 100-continue\r\n\r\n"
                ).encode()
            )
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            elapsed = time.monotonic() - started
    finally:
        gateway.stop()
    assert got.startswith(b"HTTP/1.1 413 "), got[:200]
    assert b"100 Continue" not in got
    error = json.loads(got.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "payload_too_large"
    assert elapsed < 5.0


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP answer (with a Content-Length) off a raw socket: (head, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data, b""
        data += chunk
    head, _sep, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def test_chunked_and_invited_bodies_are_read_ahead_and_served(posture, alice, bob):
    """A chunked body (with a trailer) and a body sent after `100 Continue` reach the
    app whole; the invitation comes once."""
    gateway = Gateway(posture)
    payload = b'{"input": {"q": "INC-7"}}'
    auth = f"Authorization: Bearer {alice.raw_key}\r\nContent-Type: application/json\r\n"
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            sock.sendall(
                (
                    "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
                    + "Transfer-Encoding: chunked\r\n\r\n"
                ).encode()
                + b"%x\r\n%s\r\n" % (10, payload[:10])
                + b"%x;ext=1\r\n%s\r\n" % (len(payload) - 10, payload[10:])
                + b"0\r\nX-Trailer: t\r\n\r\n"
            )  # fmt: skip
            chunked_head, chunked_body = _read_answer(sock)
            sock.sendall(
                (
                    "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
                    + f"Content-Length: {len(payload)}\r\nExpect: 100-continue\r\n\r\n"
                ).encode()
            )  # fmt: skip
            interim = sock.recv(25)
            sock.sendall(payload)
            invited_head, invited_body = _read_answer(sock)
    finally:
        gateway.stop()
    assert chunked_head.startswith(b"HTTP/1.1 200 "), chunked_head
    assert json.loads(chunked_body)["output"]["issues"][0]["key"] == "INC-7"
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert invited_head.startswith(b"HTTP/1.1 200 "), invited_head
    assert b"100 Continue" not in invited_head
    assert json.loads(invited_body)["output"]["issues"][0]["key"] == "INC-7"


def test_slow_chunked_and_oversized_bodies_are_answered_without_a_thread(posture, alice, bob):
    """Sixteen chunked bodies trickled a chunk a second get 408 past their deadline; an
    oversized length (no Expect) gets 413 at once, its body unread; B is served."""
    gateway = Gateway(posture, EAI_BODY_TIMEOUT_S="2")
    head = (
        "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {alice.raw_key}\r\nContent-Type: application/json\r\n"
    )
    socks = []
    try:
        for _ in range(16):
            sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            sock.sendall((head + "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n").encode())
            socks.append(sock)
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as big:
            started = time.monotonic()
            big.sendall((head + f"Content-Length: {50 * 1024 * 1024}\r\n\r\n").encode())
            big.sendall(b" " * 65536)
            too_large, _body = _read_answer(big)
            too_large_after = time.monotonic() - started
        b_time, (b_status, _b, _h) = gateway.timed(
            gateway.invoke, bob.raw_key, "jira.search", {"q": "INC-8"}, timeout=10
        )
        answers = []
        for sock in socks:
            for _ in range(3):  # a chunk a second, past the 2 s deadline
                with contextlib.suppress(OSError):
                    sock.sendall(b"1\r\n \r\n")
                time.sleep(0.1)
        deadline = time.monotonic() + 15
        for sock in socks:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            got = b""
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    got += chunk
            answers.append(got)
    finally:
        for sock in socks:
            sock.close()
        gateway.stop()
    assert too_large.startswith(b"HTTP/1.1 413 ") and too_large_after < 5.0
    assert b_status == 200 and b_time < 3.0, (b_status, b_time)
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), [a[:40] for a in answers]
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not Invocation.objects.for_tenant(alice.key.tenant).exists()


# ------------------------------------------------------------- the bulkheads alone


@pytest.fixture
def small_slots(settings, monkeypatch):
    settings.EAI_TENANT_MIN_SLOTS = 2
    settings.EAI_TENANT_SHARE = 0.5
    slots = bulkheads.Bulkhead(4, bulkheads.share_of(4))
    monkeypatch.setattr(bulkheads, "_REQUESTS", slots)
    return slots


def _environ(path="/v1/tools", key=None):
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    if key:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return environ


def test_a_request_slot_is_released_when_the_app_raises_or_answers(small_slots):
    def boom(environ, start_response):
        raise RuntimeError("boom")

    def fine(environ, start_response):
        bulkheads.enter_tenant(environ, "tenant-1")
        start_response("200 OK", [])
        return [b"ok"]

    with pytest.raises(RuntimeError):
        bulkheads.RequestSlots(boom)(_environ(), lambda *a: None)
    assert small_slots.held(bulkheads.KEYLESS) == 0
    answer = bulkheads.RequestSlots(fine)(_environ(key="eai_x_y"), lambda *a: None)
    assert small_slots.held("tenant-1") == 1  # held while the answer is being written
    answer.close()
    assert small_slots.held("tenant-1") == 0 and small_slots._held == {}


def test_keyless_requests_have_a_share_and_keyed_ones_take_none_of_it(small_slots):
    calls = []

    def hold(environ, start_response):
        calls.append(environ)
        start_response("200 OK", [])
        return [b"ok"]

    app = bulkheads.RequestSlots(hold)
    statuses = []
    held = [app(_environ("/admin/"), lambda s, h: statuses.append(s)) for _ in range(3)]
    assert statuses == ["200 OK", "200 OK", "429 Too Many Requests"]
    # A keyed request is not kept out by the keyless share, nor is the probe.
    app(_environ(key="eai_a_b"), lambda s, h: statuses.append(s))
    app(_environ("/healthz"), lambda s, h: statuses.append(s))
    assert statuses[3:] == ["200 OK", "200 OK"]
    for answer in held[:2]:
        answer.close()
    assert small_slots.held(bulkheads.KEYLESS) == 0


def test_a_tenant_past_its_share_is_refused_and_another_is_not(small_slots):
    tickets = [{"eai.request_slot": bulkheads._Ticket(small_slots, None)} for _ in range(4)]
    bulkheads.enter_tenant(tickets[0], "a")
    bulkheads.enter_tenant(tickets[0], "a")  # the same request again: no second slot
    bulkheads.enter_tenant(tickets[1], "a")
    with pytest.raises(bulkheads.ApiError) as refused:
        bulkheads.enter_tenant(tickets[2], "a")
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
    bulkheads.enter_tenant(tickets[3], "b")
    assert small_slots.held("a") == 2 and small_slots.held("b") == 1


def test_queued_calls_of_one_tenant_wait_behind_its_own_only():
    pool = bulkheads.FairExecutor(total=4, share=2)
    gate = threading.Event()
    ran: list[str] = []
    for _ in range(6):
        pool.submit("a", lambda: (gate.wait(10), ran.append("a")))
    done = threading.Event()
    pool.submit("b", lambda: (ran.append("b"), done.set()))
    assert done.wait(5)  # B ran while A's six waited on two threads
    assert pool.running("a") == 2 and ran == ["b"]
    gate.set()
    assert _wait_for(lambda: len(ran) == 7, timeout=10)
    assert pool.running("a") == 0


def test_an_oversized_body_sent_whole_still_gets_its_413_in_the_clients_language(posture, alice):
    """SPEC §4: the body is read and discarded first, so the client gets the answer. A
    client that writes its whole body before reading (Python's http.client, no Expect)
    broke its pipe on 5 MiB and more; and the answers the server writes before Django
    sees the request follow Accept-Language (SPEC §3)."""
    gateway = Gateway(posture, EAI_BODY_TIMEOUT_S="2")
    try:
        answers = {}
        for size, lang in ((5 * 1024 * 1024, "fr"), (20 * 1024 * 1024, "en")):
            answers[size] = gateway.request(
                "POST",
                "/v1/tools/jira.search/invoke",
                b" " * size,
                {
                    "Authorization": f"Bearer {alice.raw_key}",
                    "Content-Type": "application/json",
                    "Accept-Language": lang,
                },
            )
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as stalled:
            stalled.sendall(
                (
                    "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {alice.raw_key}\r\nContent-Type: application/json"
                    "\r\nAccept-Language: fr-FR, en;q=0.5\r\nContent-Length: 40\r\n\r\n{"
                ).encode()
            )
            slow_head, slow_body = _read_answer(stalled)  # past the 2 s body deadline
        malformed = _raw_exchange(
            gateway.port,
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Language: fr\r\n"
            b"Bad Header Line\r\n\r\n",
            half_close=False,
        )
    finally:
        gateway.stop()
    status, body, headers = answers[5 * 1024 * 1024]
    assert status == 413 and headers["Content-Language"] == "fr"
    error = json.loads(body)["error"]
    assert error["code"] == "payload_too_large"
    assert error["message"] == error["message_i18n"]["fr"] != error["message_i18n"]["en"]
    status, body, headers = answers[20 * 1024 * 1024]
    assert status == 413 and headers["Content-Language"] == "en"
    assert json.loads(body)["error"]["message"] == json.loads(body)["error"]["message_i18n"]["en"]
    assert slow_head.startswith(b"HTTP/1.1 408 ") and b"Content-Language: fr" in slow_head
    error = json.loads(slow_body)["error"]
    assert error["message"] == error["message_i18n"]["fr"]
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not Invocation.objects.for_tenant(alice.key.tenant).exists()
    assert malformed.startswith(b"HTTP/1.1 400 ") and b"Content-Language: fr" in malformed
    error = json.loads(malformed.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "invalid_request"
    assert error["message"] == error["message_i18n"]["fr"] != error["message_i18n"]["en"]


def _worker_sockets(gateway: Gateway) -> int:
    """Sockets the gateway's one worker process holds open."""
    children = Path(f"/proc/{gateway.proc.pid}/task/{gateway.proc.pid}/children").read_text()
    worker = int(children.split()[0])
    return sum(
        os.readlink(f"/proc/{worker}/fd/{fd}").startswith("socket:")
        for fd in os.listdir(f"/proc/{worker}/fd")
    )


def test_refused_bodies_that_linger_count_against_the_workers_connections(posture, alice):
    """A 413 drains what its client still sends, for a while: those connections hold a
    descriptor each, so they count against `worker_connections` (uncounted, a flood of
    oversized heads opened connections until the worker ran out of descriptors and died,
    with every call it served). The excess waits in the listen backlog; the worker lives
    and serves again once they end."""
    gateway = Gateway(posture, EAI_BODY_TIMEOUT_S="3", GUNICORN_CMD_ARGS="--worker-connections 24")
    head = (
        "POST /v1/tools/jira.search/invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {alice.raw_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {50 * 1024 * 1024}\r\n\r\n"
    ).encode()
    socks, answered = [], 0
    try:
        worker_pid_before = Path(f"/proc/{gateway.proc.pid}/task/{gateway.proc.pid}/children")
        worker_pid_before = worker_pid_before.read_text().split()[0]
        for _ in range(80):
            sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            sock.sendall(head)  # and nothing more: the server drains, waiting
            socks.append(sock)
        time.sleep(1.0)
        held = _worker_sockets(gateway)
        for sock in socks:
            sock.settimeout(8)
            with contextlib.suppress(OSError):
                if sock.recv(64).startswith(b"HTTP/1.1 413 "):
                    answered += 1
        status, _body, _headers = gateway.get("/healthz", timeout=20)
        worker_pid_after = Path(f"/proc/{gateway.proc.pid}/task/{gateway.proc.pid}/children")
        worker_pid_after = worker_pid_after.read_text().split()[0]
    finally:
        for sock in socks:
            sock.close()
        gateway.stop()
    assert held <= 24 + 4, held  # the listener and the loop's own beside the 24
    assert answered == 80  # every one got its 413, the later ones once the first ended
    assert status == 200 and worker_pid_after == worker_pid_before


def test_an_idle_connection_outlives_the_clients_own_idle_timeout(posture):
    """Node's fetch keeps an idle connection 4 s, httpx 5 s: a server closing it at 2 s
    (gunicorn's default) made the TypeScript SDK's next request on it fail now and then
    (`connection_error`). The gateway's workers keep one 10 s unless told otherwise."""
    gateway = Gateway(posture)
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            ask = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            sock.sendall(ask)
            first, _body = _read_answer(sock)
            time.sleep(6)  # past every common client's idle timeout
            sock.sendall(ask)
            second, _body = _read_answer(sock)
    finally:
        gateway.stop()
    assert first.startswith(b"HTTP/1.1 200 ") and second.startswith(b"HTTP/1.1 200 "), second
