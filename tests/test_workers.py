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
