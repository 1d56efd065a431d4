"""The LIFO thread pool of `manage.py serve`'s gunicorn worker (eai/workers.py)."""

import threading
import time
from concurrent.futures import wait

import pytest
from gunicorn.workers.gthread import ThreadWorker

from eai.workers import LifoExecutor, LifoThreadWorker


def _name() -> str:
    return threading.current_thread().name


def test_a_lone_caller_keeps_getting_the_same_warm_thread():
    pool = LifoExecutor(max_workers=8)
    try:
        names = [pool.submit(_name).result(timeout=5) for _ in range(50)]
    finally:
        pool.shutdown()
    # The stdlib pool would rotate through its threads; here one does all the work.
    assert len(set(names)) == 1


def test_the_thread_idle_the_shortest_time_takes_the_next_job():
    pool = LifoExecutor(max_workers=3)
    gates = [threading.Event() for _ in range(3)]
    try:
        busy = [pool.submit(lambda g=g: (g.wait(5), _name())[1]) for g in gates]
        for gate in gates:  # free them in order: thread 0, 1, then 2 goes idle last
            gate.set()
            busy[gates.index(gate)].result(timeout=5)
            time.sleep(0.05)
        last = busy[2].result()
        assert pool.submit(_name).result(timeout=5) == last
    finally:
        pool.shutdown()


def test_when_all_threads_are_busy_jobs_wait_and_run_in_arrival_order():
    pool = LifoExecutor(max_workers=1)
    gate = threading.Event()
    ran: list[int] = []
    try:
        blocker = pool.submit(gate.wait, 5)
        queued = [pool.submit(ran.append, n) for n in range(5)]
        assert not any(f.done() for f in queued)
        gate.set()
        wait([blocker, *queued], timeout=5)
    finally:
        pool.shutdown()
    assert ran == [0, 1, 2, 3, 4]


def test_it_never_runs_more_threads_than_asked():
    pool = LifoExecutor(max_workers=4)
    lock, running, peak = threading.Lock(), [0], [0]

    def job():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    try:
        wait([pool.submit(job) for _ in range(40)], timeout=10)
    finally:
        pool.shutdown()
    assert peak[0] == 4


def test_an_exception_reaches_the_future_and_the_thread_lives_on():
    pool = LifoExecutor(max_workers=1)
    try:
        failed = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=5)
        assert pool.submit(lambda: 42).result(timeout=5) == 42
    finally:
        pool.shutdown()


def test_shutdown_ends_the_threads_and_refuses_new_jobs():
    pool = LifoExecutor(max_workers=3)
    wait([pool.submit(time.sleep, 0.01) for _ in range(3)], timeout=5)
    threads = list(pool._threads)
    pool.shutdown(wait=True)
    assert threads and not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError):
        pool.submit(_name)


def test_shutdown_can_cancel_the_jobs_still_waiting():
    pool = LifoExecutor(max_workers=1)
    gate = threading.Event()
    blocker = pool.submit(gate.wait, 5)
    queued = pool.submit(_name)
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert blocker.result(timeout=5) is True
    assert queued.cancelled()


def test_serve_runs_gunicorn_with_this_worker():
    from gateway.management.commands import serve

    with open(serve.__file__) as file:
        assert '"worker_class": "eai.workers.LifoThreadWorker"' in file.read()
    assert issubclass(LifoThreadWorker, ThreadWorker)


def test_a_finished_job_is_not_kept_alive_while_the_thread_works_on():
    import gc
    import weakref

    class Payload:
        pass

    pool = LifoExecutor(max_workers=1)
    first_gate, second_gate = threading.Event(), threading.Event()
    payload = Payload()
    alive = weakref.ref(payload)
    try:
        first = pool.submit(lambda p: first_gate.wait(5), payload)
        second = pool.submit(second_gate.wait, 5)  # waits: the only thread is busy
        del payload
        first_gate.set()
        first.result(timeout=5)
        time.sleep(0.05)  # the thread has moved on to the second job
        del first
        gc.collect()
        assert alive() is None
        second_gate.set()
        second.result(timeout=5)
    finally:
        first_gate.set()
        second_gate.set()
        pool.shutdown()


def test_at_exit_the_running_jobs_finish_as_with_the_stdlib_pool(tmp_path):
    import subprocess
    import sys

    marker = tmp_path / "done"
    script = (
        "import time\n"
        "from eai.workers import LifoExecutor\n"
        "pool = LifoExecutor(max_workers=2)\n"
        f"pool.submit(lambda: (time.sleep(0.3), open({str(marker)!r}, 'w').close()))\n"
        "# the program ends without shutting the pool down\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    assert marker.exists()


# ----------------------------------------------------------------- InlineWorker


def _start_inline(*options: str, app: str = "tests.inline_app:app"):
    """gunicorn with one InlineWorker serving tests/inline_app.py (or `app`) on a free
    port: (process, port)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gunicorn = Path(sys.executable).parent / "gunicorn"
    proc = subprocess.Popen(
        [str(gunicorn), app, "-w", "1", "-k", "eai.workers.InlineWorker"]
        + ["-b", f"127.0.0.1:{port}", "--graceful-timeout", "2", *options],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("gunicorn with InlineWorker did not start")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def inline_server():
    proc, port = _start_inline("--keep-alive", "5")
    yield port
    proc.terminate()
    proc.wait(10)


def _get(conn, path="/", body=None):
    import json

    conn.request("POST" if body else "GET", path, body=body)
    response = conn.getresponse()
    payload = response.read()
    return response, (json.loads(payload) if response.status == 200 else payload)


def _responses(sock, count, timeout=5.0):
    """Read `count` HTTP responses (each with a Content-Length) off a raw socket."""
    sock.settimeout(timeout)
    data = b""
    found = []
    while len(found) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1")
            length = int(
                next(
                    line.split(":", 1)[1]
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length:")
                )
            )
            end = head_end + 4 + length
            if len(data) >= end:
                found.append((head, data[head_end + 4 : end]))
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return found


def test_the_inline_worker_keeps_the_connection_for_the_next_request(inline_server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=5)
    answers = [_get(conn, f"/n{i}", body=f"body {i}") for i in range(3)]
    conn.close()
    assert [a["path"] for _r, a in answers] == ["/n0", "/n1", "/n2"]
    assert [a["body"] for _r, a in answers] == ["body 0", "body 1", "body 2"]
    assert len({a["port"] for _r, a in answers}) == 1  # one TCP connection for all three
    assert all(r.getheader("Connection", "").lower() != "close" for r, _a in answers)


def test_an_idle_connection_does_not_hold_the_inline_worker(inline_server):
    import http.client
    import socket

    idle = socket.create_connection(("127.0.0.1", inline_server), timeout=5)  # sends nothing
    try:
        conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=5)
        started = time.monotonic()
        response, answer = _get(conn, "/after-idle")
        conn.close()
        assert response.status == 200 and answer["path"] == "/after-idle"
        # gthread would wait up to 5 s on the idle socket before parking it.
        assert time.monotonic() - started < 2
        # The idle connection is served once its request arrives.
        idle.sendall(b"GET /late HTTP/1.1\r\nHost: t\r\n\r\n")
        [(head, body)] = _responses(idle, 1)
        assert head.startswith("HTTP/1.1 200") and b'"/late"' in body
    finally:
        idle.close()


def test_a_request_arriving_in_pieces_is_answered_whole(inline_server):
    import socket

    with socket.create_connection(("127.0.0.1", inline_server), timeout=5) as sock:
        sock.sendall(b"POST /pieces HTTP/1.1\r\nHost: t\r\n")
        time.sleep(0.2)
        sock.sendall(b"Content-Length: 5\r\n\r\nhel")
        time.sleep(0.2)
        sock.sendall(b"lo")
        [(head, body)] = _responses(sock, 1)
    assert head.startswith("HTTP/1.1 200")
    assert b'"body": "hello"' in body and b'"/pieces"' in body


def test_a_long_pipeline_is_answered_in_order_by_the_same_process(inline_server):
    import json
    import socket

    with socket.create_connection(("127.0.0.1", inline_server), timeout=10) as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n")
        [(_head, first)] = _responses(sock, 1)
        count = 2000  # queued, not recursed: the stack would not hold this many
        sock.sendall(b"".join(b"GET /p%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(count)))
        answers = _responses(sock, count, timeout=30)
    assert [json.loads(body)["path"] for _h, body in answers] == [f"/p{i}" for i in range(count)]
    assert {json.loads(body)["pid"] for _h, body in answers} == {json.loads(first)["pid"]}


def test_the_inline_worker_answers_500_and_serves_on_after_an_app_error(inline_server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=5)
    _response, before = _get(conn, "/before")
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=5)
    response, _payload = _get(conn, "/boom")
    conn.close()
    assert response.status == 500
    conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=5)
    _response, after = _get(conn, "/after")
    conn.close()
    assert after["pid"] == before["pid"]  # the same worker process, not a restarted one


def test_a_client_asking_to_close_gets_its_connection_closed(inline_server):
    import socket

    with socket.create_connection(("127.0.0.1", inline_server), timeout=5) as sock:
        sock.sendall(b"GET /bye HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        [(head, _body)] = _responses(sock, 1)
        assert "connection: close" in head.lower()
        assert sock.recv(1) == b""  # the server closed it


def test_a_long_poll_does_not_hold_the_inline_worker(inline_server):
    """`GET …/invocations/{id}?wait=` waits on a thread of its own: a request sent after
    it is answered while it still waits (served inline, it held the process, and two of
    them both workers of `-w 2`)."""
    import http.client
    import select
    import socket

    waiting = socket.create_connection(("127.0.0.1", inline_server), timeout=10)
    waiting.sendall(b"GET /v1/tools/invocations/tinv_x?wait=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)  # it has reached the app, and sleeps there
    conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=10)
    response, answer = _get(conn, "/after")
    conn.close()
    assert response.status == 200 and answer["path"] == "/after"
    readable, _, _ = select.select([waiting], [], [], 0)
    assert readable == []  # the long poll is still waiting
    ((head, body),) = _responses(waiting, 1, timeout=10)
    assert head.startswith("HTTP/1.1 200") and b"/v1/tools/invocations/tinv_x" in body
    waiting.close()


def test_the_inline_worker_never_uses_a_thread_pool():
    from eai.workers import InlineWorker

    assert issubclass(InlineWorker, ThreadWorker)
    with pytest.raises(RuntimeError):
        InlineWorker.get_thread_pool(None).submit(print)


def test_a_first_request_arriving_late_is_answered_even_without_keep_alive():
    """A new connection is parked on the poller at once; it must get the time gthread
    gives (its 5 s wait plus keepalive), not `keepalive` alone, here 0 s."""
    import socket

    proc, port = _start_inline("--keep-alive", "0")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            time.sleep(0.5)
            sock.sendall(b"GET /late-first HTTP/1.1\r\nHost: t\r\n\r\n")
            answers = _responses(sock, 1)
        assert answers and answers[0][0].startswith("HTTP/1.1 200")
        assert b'"/late-first"' in answers[0][1]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_client_streaming_a_pipeline_does_not_hold_the_others_back(inline_server):
    """Requests pipelined without pause, cut at odd places: between two of them the
    worker goes back to its event loop, so another client is served meanwhile."""
    import http.client
    import socket
    import threading

    stop = time.monotonic() + 3.0
    request = b"GET /pipelined-xx HTTP/1.1\r\nHost: t\r\n\r\n"  # 41 bytes
    stream = socket.create_connection(("127.0.0.1", inline_server), timeout=30)

    def write() -> None:
        data = request * 1000
        try:
            while time.monotonic() < stop:
                stream.sendall(data[:8191])
                data = data[8191:] + request * 200
        except OSError:
            pass

    def read() -> None:
        try:
            while stream.recv(65536):
                pass
        except OSError:
            pass

    threads = [
        threading.Thread(target=write, daemon=True),
        threading.Thread(target=read, daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=10)
        started = time.monotonic()
        response, answer = _get(conn, "/meanwhile")
        waited = time.monotonic() - started
        conn.close()
        assert response.status == 200 and answer["path"] == "/meanwhile"
        assert waited < 1.0, f"waited {waited:.2f} s behind the pipelining client"
    finally:
        threads[0].join(5)
        stream.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason", "french"),
    [
        (b"GET /v1/tools/" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414,
         "its request line is too long", "sa ligne de requête est trop longue"),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: " + b"k" * 10000
         + b"\r\n\r\n", 431, "its header fields are too large",
         "ses champs d’en-tête sont trop grands"),
        (b"GARBAGE\r\n\r\n", 400, "it is not valid HTTP", "ce n’est pas du HTTP valide"),
    ],
)  # fmt: skip
def test_gunicorns_own_refusals_answer_with_the_envelope(request_bytes, status, reason, french):
    """A request gunicorn refuses before the app runs got its HTML page; API clients
    read the envelope (en and fr), whatever the path."""
    import json
    import socket

    proc, port = _start_inline(app="eai.wsgi")
    try:
        # The port opens before the worker has loaded Django: on a loaded machine the
        # answer may take more than a few seconds.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(request_bytes)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    finally:
        proc.terminate()
        proc.wait(10)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode())
    assert b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_request"
    assert error["message_i18n"]["en"] == f"The request is invalid: {reason}"
    assert error["message_i18n"]["fr"] == f"La requête est invalide : {french}"
    assert error["request_id"].startswith("req_")


def test_slow_requests_hand_the_loop_on_and_run_side_by_side_up_to_the_slots():
    """A request that holds the loop's thread past HANDOFF_S gives the event loop to
    another thread: with `--threads 4`, 3 s requests run side by side while a quick
    one is answered at once, and a fifth slow one waits for a free slot."""
    import http.client
    import threading

    proc, port = _start_inline("--threads", "4")
    done: dict[int, float] = {}
    started = time.monotonic()

    def slow(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", f"/sleep?s=3&n={index}")
        conn.getresponse().read()
        done[index] = time.monotonic() - started
        conn.close()

    def start(index: int) -> threading.Thread:
        thread = threading.Thread(target=slow, args=(index,), daemon=True)
        thread.start()
        time.sleep(0.1)  # in order
        return thread

    try:
        threads = [start(index) for index in range(3)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        quick_started = time.monotonic()
        response, answer = _get(conn, "/quick")
        quick = time.monotonic() - quick_started
        conn.close()
        threads += [start(index) for index in (3, 4)]  # the fifth finds four slots taken
        for thread in threads:
            thread.join(30)
    finally:
        proc.terminate()
        proc.wait(10)
    assert response.status == 200 and answer["path"] == "/quick"
    assert quick < 2.5, quick  # not behind the slow ones (3 s each)
    ends = sorted(done.values())
    # One at a time four would end at 3, 6, 9, 12 s; side by side at about 3.
    assert ends[3] < 8.5, done
    assert ends[4] >= 5.0, done  # the last waited for a slot: never more than 4 at once


def test_a_pipelined_request_cut_short_does_not_hold_the_loop(inline_server):
    """A whole request followed by the start of the next one: the first is answered,
    the second waits on the poller (not in a blocking read on the loop's thread), so
    another client is served meanwhile, and the second once it is whole."""
    import http.client
    import socket

    with socket.create_connection(("127.0.0.1", inline_server), timeout=10) as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: t\r\n\r\nGET /second HTTP/1.1\r\nHo")
        [(head, _body)] = _responses(sock, 1)
        assert head.startswith("HTTP/1.1 200")
        conn = http.client.HTTPConnection("127.0.0.1", inline_server, timeout=5)
        response, answer = _get(conn, "/meanwhile")
        conn.close()
        assert response.status == 200 and answer["path"] == "/meanwhile"
        sock.sendall(b"st: t\r\n\r\n")
        [(head, body)] = _responses(sock, 1)
    assert head.startswith("HTTP/1.1 200") and b'"/second"' in body
