"""Tenant policy modules decided under a budget, in evaluator processes of their own.

rego-cpp cannot be interrupted from Python: a tenant's module that loops for seconds, or
grows to gigabytes, would hold a serving thread (and the GIL-free CPU) for as long as it
likes. So a decision that involves a tenant's modules is sent to a small pool of
long-lived evaluator processes (`python -m gateway.policy_worker`), started lazily
by each serving process (after gunicorn's fork), fed over a pipe. The bounds are the
kernel's, so they hold inside rego-cpp's own loops:

- CPU: the evaluator arms `ITIMER_PROF` with the decision's budget before each
  decision; past it SIGPROF, whose default action ends the process.
- Memory: rego-cpp's allocator cannot start under an address-space rlimit, but once it
  has started (a warm-up decision) the evaluator sets `RLIMIT_AS` to its size plus the
  budget; an allocation past it aborts the process (`std::bad_alloc`) or raises
  MemoryError. An evaluator that kept a quarter of the budget retires after answering.
- Wall time: the serving thread waits at most `wall_seconds` (a starved or stuck
  evaluator), then kills it.

A dead evaluator is replaced by a new one at the next call. A tenant holds at most
`per_tenant` evaluators at once and the pool waits at most QUEUE_WAIT_S for a free one:
past either the caller gets EvaluatorsBusy at once, so one tenant's costly modules
never take every evaluator (nor park every serving thread behind them).

Frames on both pipes are a 4-byte big-endian length and UTF-8 JSON. Request:
`{"version", "modules" (null when the evaluator should have them), "document",
"cpu_s"}`. Answer: `{"decision": {...}}`, `{"error": "..."}`, `{"need": true}` (send
the modules), or `{"budget": "memory"}`; `"retire": true` may ride along.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20
# How long a call may wait for a free evaluator when the pool is busy (SPEC §14: any
# wait at most 0.25 s).
QUEUE_WAIT_S = 0.25


class BudgetExceeded(Exception):
    """The decision went past its CPU (`kind` "cpu"), memory ("memory") or wall-clock
    ("time") bound; its evaluator was ended."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(kind)


class EvaluatorsBusy(Exception):
    """The tenant already holds its share of evaluators, or none freed up in time."""


class EvaluatorFailed(Exception):
    """The evaluator stopped or answered nonsense (not a budget the module exceeded)."""


class EvaluatorGone(Exception):
    """The evaluator had stopped before it was sent anything (killed while idle): no
    module is to blame, the decision is tried on another one."""


@dataclass(frozen=True)
class Budget:
    cpu_seconds: float
    memory_bytes: int
    wall_seconds: float


def child_environment(**extra: str) -> dict[str, str]:
    """The environment of a process that runs tenant Rego: nothing of the server's.
    rego-cpp's `opa.runtime()` returns its process's environment, so with the server's
    a module could deny with a reason holding EAI_SECRET_KEY or a database password."""
    root = str(Path(__file__).resolve().parent.parent)
    inherited = os.environ.get("PYTHONPATH", "")
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "PYTHONPATH": root + (os.pathsep + inherited if inherited else ""),
        **extra,
    }


class Evaluator:
    """One evaluator process and what it has been sent; used by one thread at a time."""

    def __init__(self, memory_bytes: int) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        env = child_environment(EAI_POLICY_EVALUATOR_MEMORY=str(memory_bytes))
        # What rego-cpp prints (compile errors, an abort's message) lands here, read
        # when the process dies unexpectedly; a new file for each process.
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the process)
        self.memory_bytes = memory_bytes
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.policy_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=root,
            env=env,
            bufsize=0,
        )
        self.versions: set[str] = set()
        self.alive = True

    def decide(
        self, version: str, modules: list[tuple[str, str]], document: dict[str, Any], budget: Budget
    ) -> dict[str, Any]:
        """The combined decision, or BudgetExceeded / EvaluatorFailed (the evaluator is
        then dead), or PolicyError-worthy `{"error": ...}` as a dict."""
        if self.proc.poll() is not None:
            self.kill()
            raise EvaluatorGone
        request = {"version": version, "document": document, "cpu_s": budget.cpu_seconds}
        known = version in self.versions
        answer = self._exchange({**request, "modules": None if known else modules}, budget)
        if answer.get("need"):  # it let the bundle go: send the modules again
            answer = self._exchange({**request, "modules": modules}, budget)
        self.versions.add(version)
        if answer.get("retire"):
            self.close()
        if answer.get("budget") == "memory":
            self.kill()
            raise BudgetExceeded("memory")
        return answer

    def _exchange(self, request: dict[str, Any], budget: Budget) -> dict[str, Any]:
        payload = json.dumps(request, separators=(",", ":")).encode()
        try:
            self.proc.stdin.write(HEADER.pack(len(payload)) + payload)
        except (OSError, ValueError):  # it was gone before it read a byte of this
            self.kill()
            raise EvaluatorGone from None
        deadline = time.monotonic() + budget.wall_seconds
        try:
            (length,) = HEADER.unpack(self._read(HEADER.size, deadline))
            if length > MAX_FRAME:
                raise EvaluatorFailed("an answer too large")
            return json.loads(self._read(length, deadline))
        except TimeoutError:
            self.kill()
            raise BudgetExceeded("time") from None
        except EOFError:
            raise self._died() from None
        except ValueError:
            self.kill()
            raise EvaluatorFailed("an answer that is not JSON") from None

    def _read(self, size: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        # poll, not select: a busy server's descriptors may be numbered past 1024.
        waiting = select.poll()
        waiting.register(fd, select.POLLIN)
        chunks, got = [], 0
        while got < size:
            left = deadline - time.monotonic()
            if left <= 0 or not waiting.poll(left * 1000):
                raise TimeoutError
            chunk = os.read(fd, size - got)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _died(self) -> Exception:
        """Why the evaluator stopped: SIGPROF is its CPU budget, an abort on an
        allocation (or SIGKILL from the kernel's OOM killer) its memory budget."""
        self.alive = False
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return EvaluatorFailed("it stopped answering")
        if code == -signal.SIGPROF or code == -signal.SIGXCPU:
            self._release()
            return BudgetExceeded("cpu")
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - 4096))
        said = self.stderr.read().decode("utf-8", "replace")
        self._release()
        if "bad_alloc" in said or "MemoryError" in said or code == -signal.SIGKILL:
            return BudgetExceeded("memory")
        return EvaluatorFailed(f"it stopped (exit status {code})")

    def kill(self) -> None:
        self.alive = False
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._release()

    def close(self) -> None:
        """End the process once it has read its end of file (an orderly retirement)."""
        self.alive = False
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._release()

    def _release(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            with contextlib.suppress(OSError):
                stream.close()


class Pool:
    """At most `size` evaluators per serving process; at most `per_tenant` of them held
    by one tenant at once."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Condition()
        self._idle: list[Evaluator] = []
        self._count = 0  # evaluators alive or being started, idle or held
        self._held: dict[str, int] = {}

    def decide(
        self,
        tenant: str,
        version: str,
        modules: list[tuple[str, str]],
        document: dict[str, Any],
        budget: Budget,
        *,
        size: int,
        per_tenant: int,
    ) -> dict[str, Any]:
        args = (tenant, version, modules, document, budget, size, per_tenant)
        try:
            return self._decide_once(*args)
        except EvaluatorGone:  # killed while idle: once more, on a live one
            try:
                return self._decide_once(*args)
            except EvaluatorGone:
                raise EvaluatorFailed("it stopped before the decision") from None

    def _decide_once(
        self,
        tenant: str,
        version: str,
        modules: list[tuple[str, str]],
        document: dict[str, Any],
        budget: Budget,
        size: int,
        per_tenant: int,
    ) -> dict[str, Any]:
        evaluator = self._acquire(tenant, version, budget.memory_bytes, size, per_tenant)
        try:
            return evaluator.decide(version, modules, document, budget)
        finally:
            self._give_back(tenant, evaluator)

    def _acquire(
        self, tenant: str, version: str, memory_bytes: int, size: int, per_tenant: int
    ) -> Evaluator:
        deadline = time.monotonic() + QUEUE_WAIT_S
        with self._lock:
            if self._held.get(tenant, 0) >= per_tenant:
                raise EvaluatorsBusy
            while not self._idle and self._count >= size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EvaluatorsBusy
                self._lock.wait(left)
            self._held[tenant] = self._held.get(tenant, 0) + 1
            evaluator = self._choose(version, size)
            if evaluator is None:
                self._count += 1
        if evaluator is not None and evaluator.memory_bytes == memory_bytes:
            return evaluator
        if evaluator is not None:  # the memory budget changed since it started
            evaluator.close()
        try:
            return Evaluator(memory_bytes)
        except BaseException:
            with self._lock:
                self._count -= 1
                self._held[tenant] -= 1
                self._lock.notify()
            raise

    def _choose(self, version: str, size: int) -> Evaluator | None:
        """An idle evaluator that has this policy already; else None (start one) while
        the pool has room; else the one idle longest. So a tenant whose module keeps
        ending its evaluators pays for starting new ones itself, and does not take,
        and end, the warm evaluator another tenant just gave back."""
        for index in range(len(self._idle) - 1, -1, -1):
            if version in self._idle[index].versions:
                return self._idle.pop(index)
        if self._count < size or not self._idle:
            return None
        return self._idle.pop(0)

    def _give_back(self, tenant: str, evaluator: Evaluator) -> None:
        with self._lock:
            self._held[tenant] -= 1
            if not self._held[tenant]:
                del self._held[tenant]
            if evaluator.alive:
                self._idle.append(evaluator)
            else:
                self._count -= 1
            self._lock.notify()

    def close(self) -> None:
        """End every idle evaluator (tests, and a process that stops)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for evaluator in idle:
            evaluator.close()


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    """This process's pool; a forked child (a gunicorn or Celery worker) gets its own,
    never the pipes of its parent's evaluators."""
    global _pool
    pool_now = _pool
    if pool_now is not None and pool_now.pid == os.getpid():
        return pool_now
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = Pool()
        return _pool
