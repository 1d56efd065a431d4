"""Where the invoke path's time goes: cProfile over in-process invokes (Django test client).

Same production settings as `bench/run.py` (PostgreSQL, Redis), same echo upstream and
seed (this recreates the eai_bench database). Warms up, then profiles N calls
(EAI_BENCH_PROFILE_CALLS, default 500) of `POST /v1/tools/echo/invoke` and prints the
top entries by cumulative time. Run: `.venv/bin/python bench/profile_invoke.py`.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path

import run as bench  # bench/run.py, beside this file

CALLS = int(os.environ.get("EAI_BENCH_PROFILE_CALLS", "500"))
TOP = int(os.environ.get("EAI_BENCH_PROFILE_TOP", "15"))
PROJECT_CODE = r"/(gateway|tenants|eai|approvals)/[^/]+\.py"


def main() -> int:
    procs = bench.Processes(Path(tempfile.mkdtemp(prefix="eai-bench-profile-")))
    try:
        bench.preflight()
        port = bench.free_port()
        echo = procs.start("echo", bench.echo_argv(port), bench.bench_env())
        bench.wait_ready(procs, "echo", echo, "POST", port, "/")
        keys = bench.setup_database(f"http://{bench.HOST}:{port}/")

        os.environ.update(bench.bench_env())
        os.environ["DJANGO_SETTINGS_MODULE"] = "eai.settings"
        sys.path.insert(0, str(bench.ROOT))
        import django

        django.setup()
        from django.test import Client

        client = Client(HTTP_HOST=bench.HOST, HTTP_AUTHORIZATION=f"Bearer {keys[0]}")

        def call() -> None:
            response = client.post(
                "/v1/tools/echo/invoke", bench.BODY, content_type="application/json"
            )
            if response.status_code != 200:
                raise bench.BenchError(f"invoke answered {response.status_code}")

        for _ in range(50):
            call()
        started = time.perf_counter()
        for _ in range(CALLS):
            call()
        plain = (time.perf_counter() - started) / CALLS * 1000
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{CALLS} in-process invokes, unprofiled: {plain:.2f} ms per call")

        # SQL statements per call and their time (Django cursor + psycopg + server).
        from django.db import connection

        statements: dict[str, list[float]] = {}

        def timed(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
            begun = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                statements.setdefault(sql[:90], []).append(time.perf_counter() - begun)

        commits: list[float] = []
        plain_commit = connection._commit

        def timed_commit() -> None:
            begun = time.perf_counter()
            try:
                plain_commit()
            finally:
                commits.append(time.perf_counter() - begun)

        connection._commit = timed_commit
        try:
            with connection.execute_wrapper(timed):
                for _ in range(CALLS):
                    call()
        finally:
            del connection._commit
        total = sum(sum(times) for times in statements.values()) / CALLS * 1000
        commit_ms = sum(commits) / CALLS * 1000
        print(
            f"\nSQL per call: {total:.2f} ms in execute() (BEGIN is sent with the first"
            f" statement of each transaction) + {commit_ms:.2f} ms in"
            f" {len(commits) / CALLS:.1f} COMMITs"
        )
        for sql, times in sorted(statements.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {sum(times) / CALLS * 1000:6.2f} ms  x{len(times) / CALLS:.1f}  {sql}")

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(CALLS):
            call()
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        # The first cumulative entries are always the test client and middleware wrappers:
        # list the project's own functions (gateway/, tenants/, eai/), then the hot leaves.
        out.write(f"cProfile of {CALLS} more invokes: top {TOP} project functions, cumulative\n")
        stats.sort_stats("cumulative").print_stats(PROJECT_CODE, TOP)
        out.write(f"Top {TOP} by own time (tottime)\n")
        stats.sort_stats("tottime").print_stats(TOP)
        root = f"{bench.ROOT}/"
        print(re.sub(r"\n{3,}", "\n\n", out.getvalue()).replace(root, ""))
        return 0
    except bench.BenchError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    finally:
        procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
