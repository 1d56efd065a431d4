"""`make bench`: load-test the invoke path (REST `/invoke` and MCP `tools/call` on `/v1/mcp`)
against a bare echo and the framework floor.

Production settings (PostgreSQL via EAI_DATABASE_URL, Redis via EAI_REDIS_URL), gunicorn
with 2 workers of the production class (eai.workers.InlineWorker; other classes can be
measured beside it, their runs interleaved, the fastest at c=16 kept), a uvicorn echo
upstream, `hey` as the load generator, all on 127.0.0.1. See BENCHMARKS.md for what is
measured and how the figures are defined. Ends with one `BENCH …` line.

Overridable through the environment: EAI_BENCH_PG_ADMIN_URL (default
postgres://postgres@127.0.0.1:5432/postgres), EAI_BENCH_DB (eai_bench), EAI_BENCH_REDIS_URL
(redis://127.0.0.1:6379/0), EAI_BENCH_SECONDS (12: each measured run is sized from its
warm-up's rate to last about this long), EAI_BENCH_N1 (at most 2000 requests at c=1),
EAI_BENCH_N16 (at most 8000 at c=16), EAI_BENCH_WARMUP (200 at c=1),
EAI_BENCH_WORKER_CLASSES (inline; a comma-separated choice of inline, sync and gthread,
inline being eai.workers.InlineWorker and gthread running 4 threads).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"

PG_ADMIN_URL = os.environ.get(
    "EAI_BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
DB_NAME = os.environ.get("EAI_BENCH_DB", "eai_bench")
# The production posture: migrations as the tables' owner, the gateway as the app role
# (not superuser, not BYPASSRLS, owns nothing), so every row it writes or reads passes
# the tenant policy. A superuser would skip row-level security altogether: 2-5 % more
# calls a second, measured here, for a setup nobody should run.
# Named after the database, so two benches on one server (EAI_BENCH_DB) keep apart.
OWNER_ROLE = f"{DB_NAME}_owner"
APP_ROLE = f"{DB_NAME}_app"
ROLE_PASSWORD = secrets.token_hex(16)  # set on both roles for this run, as setup_postgres does
REDIS_URL = os.environ.get("EAI_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
N1 = int(os.environ.get("EAI_BENCH_N1", "2000"))
N16 = int(os.environ.get("EAI_BENCH_N16", "8000"))
WARMUP = int(os.environ.get("EAI_BENCH_WARMUP", "200"))
# Target length of each measured run; the counts above are the caps.
SECONDS = float(os.environ.get("EAI_BENCH_SECONDS", "12"))
MIN1, MIN16 = 200, 400  # hey reports p99 from 100 requests on
WORKER_CLASSES = os.environ.get("EAI_BENCH_WORKER_CLASSES", "inline").split(",")
TENANTS = 16
BODY = '{"input":{"msg":"hello"}}'
# The same call through MCP (`POST /v1/mcp`, tools/call), in the handshake era most hosts
# speak (2025-11-25; stateless, so no initialize is needed before it).
MCP_BODY = (
    '{"jsonrpc":"2.0","id":1,"method":"tools/call",'
    '"params":{"name":"echo","arguments":{"msg":"hello"}}}'
)
MCP_HEADERS = ("MCP-Protocol-Version: 2025-11-25",)
ECHO_BODY = '{"msg":"hello"}'
SECRET_KEY = "bench-only-secret-key-not-for-production-0123456789abcdefghijklmnop"  # noqa: S105


class BenchError(Exception):
    """A failure that ends the bench with a message and a non-zero exit."""


# ------------------------------------------------------------------- processes


class Processes:
    """Every process the bench starts, each in its own group; all stopped on exit."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.running: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.running.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        self.running = [(n, p) for n, p in self.running if p is not proc]
        if proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        for _, proc in list(reversed(self.running)):
            self.stop(proc)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def wait_ready(
    procs: Processes, name: str, proc: subprocess.Popen, method: str, port: int, path: str
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited early:\n{procs.log_tail(name)}")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request(method, path, body=ECHO_BODY if method == "POST" else None)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise BenchError(f"{name} not ready on port {port} after 30 s:\n{procs.log_tail(name)}")


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> str:
    result = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise BenchError(
            f"{' '.join(argv[:4])} … failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


# ------------------------------------------------------------------ preflight


def psql(*sql: str) -> str:
    argv = ["psql", PG_ADMIN_URL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At"]
    for statement in sql:
        argv += ["-c", statement]
    return run(argv, timeout=60)


def preflight() -> None:
    if shutil.which("psql") is None:
        raise BenchError("psql not found: the bench needs the PostgreSQL client and server.")
    try:
        psql("SELECT 1")
    except (BenchError, subprocess.TimeoutExpired) as exc:
        raise BenchError(
            f"PostgreSQL is not reachable at {PG_ADMIN_URL} (set EAI_BENCH_PG_ADMIN_URL, or "
            f"start it, e.g. `pg_ctlcluster 15 main start`).\n{exc}"
        ) from exc
    import redis  # the project's own dependency

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()
    except redis.RedisError as exc:
        raise BenchError(
            f"Redis is not reachable at {REDIS_URL} (set EAI_BENCH_REDIS_URL, or start "
            f"redis-server).\n{exc}"
        ) from exc
    if shutil.which("hey") is None:
        print("hey not found: installing the Debian package", flush=True)
        subprocess.run(
            ["sh", "-c", "command -v hey || (apt-get update -q && apt-get install -y -q hey)"],
            check=True,
        )
        if shutil.which("hey") is None:
            raise BenchError("could not install hey (apt-get install -y hey)")


# ---------------------------------------------------------------------- hey


@dataclass
class Result:
    """One measurement: latencies in ms, rps, status codes, connection errors."""

    label: str
    rps: float
    p50: float
    p99: float
    statuses: Counter = field(default_factory=Counter)
    errors: int = 0
    method: str = ""

    @property
    def non2xx(self) -> int:
        bad = sum(n for code, n in self.statuses.items() if not 200 <= code < 300)
        return bad + self.errors

    @property
    def total(self) -> int:
        return sum(self.statuses.values()) + self.errors


def hey_env(c: int) -> dict[str, str]:
    """hey's environment: one Go thread for a `-c 1` process. Such a hey sends one
    request at a time, and Go's default of one thread a core spent the shared two cores
    spinning between requests: measured here at 16 × `hey -c 1`, 0.31 -> 0.25 ms of hey
    CPU an invoke, and the bare echo's c=16 rate 10k -> 16k/s. Every `-c 1` run (echo,
    floor, invoke) gets it, so the ratios compare like with like; a `hey -c 16` keeps
    Go's default, as in earlier passes."""
    return {**os.environ, "GOMAXPROCS": "1"} if c == 1 else dict(os.environ)


def hey_argv(
    url: str,
    n: int,
    c: int,
    post: bool,
    key: str | None,
    csv: bool = False,
    body: str = BODY,
    headers: tuple[str, ...] = (),
) -> list[str]:
    argv = ["hey", "-n", str(n), "-c", str(c), "-t", "30", *(["-o", "csv"] if csv else [])]
    if post:
        argv += ["-m", "POST", "-T", "application/json", "-d", body]
    if key:
        argv += ["-H", f"Authorization: Bearer {key}"]
    for header in headers:
        argv += ["-H", header]
    return [*argv, url]


def parse_hey_text(label: str, text: str) -> Result:
    """Parse hey's summary: Requests/sec, latency distribution, status codes, errors."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    pct = {int(p): float(s) * 1000 for p, s in re.findall(r"(\d+)% in ([\d.]+) secs", text)}
    statuses: Counter = Counter()
    errors = 0
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Status code distribution"):
            section = "status"
        elif stripped.startswith("Error distribution"):
            section = "error"
        elif section == "status" and (m := re.match(r"\[(\d+)\]\s+(\d+) responses", stripped)):
            statuses[int(m[1])] += int(m[2])
        elif section == "error" and (m := re.match(r"\[(\d+)\]", stripped)):
            errors += int(m[1])
    if rps is None:
        raise BenchError(f"could not parse hey's output for {label}:\n{text[-2000:]}")
    # hey omits a percentile it cannot place (p99 needs at least 100 requests).
    p50, p99 = pct.get(50, math.nan), pct.get(99, math.nan)
    return Result(label, float(rps[1]), p50, p99, statuses, errors, "1 hey")


def hey(
    label: str,
    url: str,
    n: int,
    c: int,
    post: bool,
    key: str | None = None,
    body: str = BODY,
    headers: tuple[str, ...] = (),
) -> Result:
    out = run(
        hey_argv(url, n, c, post, key, body=body, headers=headers), env=hey_env(c), timeout=600
    )
    return parse_hey_text(label, out)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def hey_parallel(
    label: str,
    url: str,
    n_total: int,
    post: bool,
    keys: list[str | None],
    body: str = BODY,
    headers: tuple[str, ...] = (),
) -> Result:
    """One `hey -c 1` per key, all at once; latencies merged from hey's CSV output.

    rps = successful-or-not responses of all processes / wall time from the first start
    to the last exit (so hey's start-up counts against it: slightly conservative).
    """
    per = max(1, n_total // len(keys))
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            hey_argv(url, per, 1, post, key, csv=True, body=body, headers=headers),
            cwd=ROOT,
            env=hey_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key in keys
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    wall = time.monotonic() - started
    latencies: list[float] = []
    statuses: Counter = Counter()
    errors = 0
    for proc, (out, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise BenchError(f"hey failed for {label} ({proc.returncode}):\n{err[-2000:]}")
        rows = 0
        for line in out.splitlines():
            cols = line.split(",")
            if len(cols) != 8 or not cols[6].isdigit():
                continue  # header
            latencies.append(float(cols[0]) * 1000)
            statuses[int(cols[6])] += 1
            rows += 1
        errors += per - rows  # hey leaves failed requests (connection errors) out of its CSV
    if not latencies:
        raise BenchError(f"no response recorded for {label}")
    latencies.sort()
    total = len(latencies) + errors
    return Result(
        label,
        total / wall,
        percentile(latencies, 50),
        percentile(latencies, 99),
        statuses,
        errors,
        f"{len(keys)} hey -c 1",
    )


# --------------------------------------------------------------------- phases


def bench_env(echo_url: str = "") -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("EAI_", "DJANGO_"))
    }
    env.update(
        EAI_DATABASE_URL=role_url(APP_ROLE),  # the owner's URL goes to `migrate` alone
        EAI_DB_APP_ROLE=APP_ROLE,
        EAI_REDIS_URL=REDIS_URL,
        EAI_SECRET_KEY=SECRET_KEY,
        EAI_ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    if echo_url:
        env["EAI_BENCH_ECHO_URL"] = echo_url
    return env


def role_url(role: str) -> str:
    """The bench database's URL as `role`, on the admin URL's host and port."""
    parts = urlsplit(PG_ADMIN_URL)
    where = parts.netloc.rpartition("@")[2]  # host and port as given ([::1] included)
    netloc = f"{quote(role)}:{quote(ROLE_PASSWORD)}@{where}"
    return urlunsplit((parts.scheme, netloc, f"/{DB_NAME}", parts.query, ""))


def setup_database(echo_url: str) -> list[str]:
    psql(f'DROP DATABASE IF EXISTS "{DB_NAME}"')
    env = bench_env(echo_url)
    python = str(BIN / "python")
    # README's PostgreSQL steps: roles, database and schema, then migrate as the owner.
    run(
        [
            *(python, "manage.py", "setup_postgres", "--admin-url", PG_ADMIN_URL),
            *("--database-name", DB_NAME, "--owner", OWNER_ROLE, "--app", APP_ROLE),
            *("--owner-password", ROLE_PASSWORD, "--app-password", ROLE_PASSWORD),
        ],
        env=env,
    )
    run(
        [python, "manage.py", "migrate", "--database", "migrate", "--noinput"],
        env={**env, "EAI_MIGRATE_DATABASE_URL": role_url(OWNER_ROLE)},
    )
    seed = (ROOT / "bench" / "seed.py").read_text()
    result = subprocess.run(
        [python, "manage.py", "shell"],
        cwd=ROOT,
        env=env,
        input=seed,
        capture_output=True,
        text=True,
        timeout=300,
    )
    match = re.search(r"^BENCH_SEED (.+)$", result.stdout, re.M)
    if result.returncode != 0 or match is None:
        raise BenchError(f"seeding failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    keys = json.loads(match[1])["keys"]
    if len(keys) != TENANTS:
        raise BenchError(f"seed made {len(keys)} keys, expected {TENANTS}")
    return keys


def sized(warm: Result, most: int, least: int) -> int:
    """Requests for a run of about SECONDS at the rate the warm-up showed, in [least, most].

    So the bench stays within a few minutes while the path is slow, and uses the full
    counts (EAI_BENCH_N1, EAI_BENCH_N16) once it is fast.
    """
    return int(min(most, max(least, warm.rps * SECONDS)))


def warm_up_pair(
    label: str, url: str, post: bool, keys: list[str | None], **request: Any
) -> tuple[Result, Result]:
    """A c=1 warm-up (WARMUP requests) and a 16-way one (20 per process): also rate probes."""
    one = hey(f"{label} warm-up c=1", url, WARMUP, 1, post=post, key=keys[0], **request)
    many = hey_parallel(f"{label} warm-up c=16", url, 20 * len(keys), post, keys, **request)
    return one, many


def bench_echo(url: str) -> dict[str, Result]:
    w1, w16 = warm_up_pair("echo", url, True, [None] * TENANTS)
    return {
        "echo_c1": hey("bare echo c=1", url, sized(w1, N1, MIN1), 1, post=True),
        "echo_c16": hey_parallel(
            "bare echo c=16", url, sized(w16, N16, MIN16), True, [None] * TENANTS
        ),
    }


# Each MCP run right after its /invoke twin: a machine that drifts weighs on both alike.
# At c=1 the pair runs MCP_PAIRS times (the later ones named `…#2`, `…#3`): MCP's added
# p50 is the median of the pairs' differences, a fraction of a millisecond that one pair
# on a shared machine cannot resolve.
MCP_PAIRS = 3
RUNS = (
    "floor_c1",
    "floor_c16",
    "floor_c16_one_hey",
    "invoke_c1",
    "mcp_c1",
    *(f"{kind}_c1#{k}" for k in range(2, MCP_PAIRS + 1) for kind in ("invoke", "mcp")),
    "invoke_c16",
    "mcp_c16",
    "same_tenant_c16",
)
MCP = {"body": MCP_BODY, "headers": MCP_HEADERS}


def bench_gateways(bases: dict[str, str], keys: list[str]) -> tuple[dict[str, dict], int]:
    """Floor view and invoke runs against every gunicorn (one per worker class), also
    returning the warm-ups' non-2xx. Interleaved: each kind of run goes through every
    class, in an order that rotates from one kind to the next, before the next kind
    starts; so a machine that drifts during the bench weighs on every class alike."""
    sizes: dict[str, dict[str, tuple[int, int]]] = {}
    warm_non2xx = 0
    for wc, base in bases.items():
        f1, f16 = warm_up_pair(f"floor [{wc}]", f"{base}/healthz", False, [None] * TENANTS)
        i1, i16 = warm_up_pair(f"invoke [{wc}]", f"{base}/v1/tools/echo/invoke", True, keys)
        m1, m16 = warm_up_pair(f"mcp [{wc}]", f"{base}/v1/mcp", True, keys, **MCP)
        sizes[wc] = {
            "floor": (sized(f1, N1, MIN1), sized(f16, N16, MIN16)),
            "invoke": (sized(i1, N1, MIN1), sized(i16, N16, MIN16)),
            # As many calls as /invoke's: the two doors are compared run for run.
            "mcp": (sized(i1, N1, MIN1), sized(i16, N16, MIN16)),
        }
        warm_non2xx += i1.non2xx + i16.non2xx + m1.non2xx + m16.non2xx
    results: dict[str, dict[str, Result]] = {wc: {} for wc in bases}
    classes = list(bases)
    for index, name in enumerate(RUNS):
        run = name.split("#")[0]
        turn = index % len(classes)
        for wc in classes[turn:] + classes[:turn]:
            floor, invoke = f"{bases[wc]}/healthz", f"{bases[wc]}/v1/tools/echo/invoke"
            mcp = f"{bases[wc]}/v1/mcp"
            n1, n16 = sizes[wc][run.split("_")[0] if run.startswith(("floor", "mcp")) else "invoke"]
            label = f"{name} [{wc}]"
            if run == "floor_c1":
                result = hey(label, floor, n1, 1, post=False)
            elif run == "floor_c16":
                result = hey_parallel(label, floor, n16, False, [None] * TENANTS)
            elif run == "floor_c16_one_hey":
                result = hey(label, floor, n16, 16, post=False)
            elif run == "invoke_c1":
                result = hey(label, invoke, n1, 1, post=True, key=keys[0])
            elif run == "invoke_c16":
                result = hey_parallel(label, invoke, n16, True, keys)
            elif run == "mcp_c1":
                result = hey(label, mcp, n1, 1, post=True, key=keys[0], **MCP)
            elif run == "mcp_c16":
                result = hey_parallel(label, mcp, n16, True, keys, **MCP)
            else:
                result = hey(label, invoke, n16, 16, post=True, key=keys[0])
            results[wc][name] = result
    return results, warm_non2xx


def echo_argv(port: int) -> list[str]:
    return [
        str(BIN / "uvicorn"),
        "echo_app:app",
        "--app-dir",
        str(ROOT / "bench"),
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]


def start_gunicorn(procs: Processes, worker_class: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [str(BIN / "gunicorn"), "eai.wsgi", "-w", "2", "-b", f"{HOST}:{port}"]
    if worker_class == "gthread":
        argv += ["-k", "gthread", "--threads", "4"]
    elif worker_class == "inline":
        argv += ["-k", "eai.workers.InlineWorker"]
    elif worker_class != "sync":
        raise BenchError(f"unknown worker class {worker_class!r} (inline, sync or gthread)")
    name = f"gunicorn-{worker_class}"
    proc = procs.start(name, argv, bench_env())
    wait_ready(procs, name, proc, "GET", port, "/healthz")
    return proc, f"http://{HOST}:{port}"


def verify_audit() -> tuple[bool, str]:
    result = subprocess.run(
        [str(BIN / "python"), "manage.py", "verify_audit"],
        cwd=ROOT,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    chains = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    valid = result.returncode == 0 and bool(chains) and all(c["valid"] for c in chains)
    length = sum(c.get("length", 0) for c in chains)
    summary = f"{len(chains)} tenant chains, {length} entries, valid={str(valid).lower()}"
    if not valid:
        summary += f"\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return valid, summary


# -------------------------------------------------------------------- report


def machine() -> str:
    pg = psql("SHOW server_version").strip()
    return (
        f"nproc={os.cpu_count()} python={sys.version.split()[0]} postgresql={pg} "
        f"load average={load_average()}"
    )


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_table(rows: list[tuple[str, Result]]) -> None:
    print(
        f"| {'run':<42} | {'method':<12} | {'p50 ms':>7} | {'p99 ms':>7} | {'rps':>8} "
        f"| {'non-2xx':>7} |"
    )
    print(f"| {'-' * 42} | {'-' * 12} | {'-' * 6}: | {'-' * 6}: | {'-' * 7}: | {'-' * 6}: |")
    for label, r in rows:
        print(
            f"| {label:<42} | {r.method:<12} | {r.p50:7.2f} | {r.p99:7.2f} | {r.rps:8.1f} "
            f"| {r.non2xx:7d} |"
        )


def main() -> int:
    started = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="eai-bench-"))
    procs = Processes(logdir)
    try:
        preflight()
        print(f"machine: {machine()}", flush=True)
        echo_port = free_port()
        echo = procs.start("echo", echo_argv(echo_port), bench_env())
        wait_ready(procs, "echo", echo, "POST", echo_port, "/")
        echo_url = f"http://{HOST}:{echo_port}/"
        print(f"echo upstream on {echo_url}; database {DB_NAME}: migrate and seed", flush=True)
        keys = setup_database(echo_url)

        print("measuring the bare echo", flush=True)
        results = bench_echo(echo_url)
        bases = {}
        for worker_class in WORKER_CLASSES:
            _proc, bases[worker_class] = start_gunicorn(procs, worker_class)
        # No VACUUM or ANALYZE of the new database here: it would record its tables as
        # empty, and each server process would keep the plans made on that belief (the
        # foreign-key check of an invocation's decision as a sequential scan) while the
        # tables grow under the load: 24k scans over 286M rows in one run, 800 -> 500
        # calls/s. A database that was never analysed is planned as if each table had
        # ten pages, which picks the indexes.
        print(f"measuring gunicorn -w 2 ({', '.join(bases)}), run by run", flush=True)
        per_class, warm_non2xx = bench_gateways(bases, keys)
        for proc in [p for name, p in procs.running if name.startswith("gunicorn-")]:
            procs.stop(proc)

        audit_ok, audit_summary = verify_audit()
        kept = max(per_class, key=lambda wc: per_class[wc]["invoke_c16"].rps)
        results.update(per_class[kept])

        print()
        rows = [("bare echo c=1", results["echo_c1"]), ("bare echo c=16", results["echo_c16"])]
        for wc, res in per_class.items():
            tag = f"[{wc}{', kept' if wc == kept else ''}]"
            rows += [
                (f"floor /healthz c=1 {tag}", res["floor_c1"]),
                (f"floor /healthz c=16 {tag}", res["floor_c16"]),
                (f"floor /healthz c=16 one hey {tag}", res["floor_c16_one_hey"]),
                (f"invoke c=1 {tag}", res["invoke_c1"]),
                (f"invoke c=16, 16 tenants {tag}", res["invoke_c16"]),
                (f"invoke c=16, same tenant {tag}", res["same_tenant_c16"]),
                (f"mcp tools/call c=1 {tag}", res["mcp_c1"]),
                (f"mcp tools/call c=16, 16 tenants {tag}", res["mcp_c16"]),
            ]
        print_table(rows)
        gateway_runs = [
            r for res in per_class.values() for k, r in res.items() if not k.startswith("floor")
        ]
        non2xx = warm_non2xx + sum(r.non2xx for r in gateway_runs)
        gateway_requests = sum(r.total for r in gateway_runs)
        print()
        print(f"kept worker class: {kept} (higher invoke rps at c=16, 16 tenants)")
        print(
            f"gateway requests (measured runs, all worker classes): {gateway_requests}; "
            f"non-2xx incl. warm-ups: {non2xx}"
        )
        print(f"verify_audit after the load: {audit_summary}")
        print(f"load average at the end: {load_average()} (other work on the machine skews)")
        print(f"bench wall time: {time.monotonic() - started:.0f} s; logs in {logdir}")
        added_p50 = results["invoke_c1"].p50 - results["echo_c1"].p50
        added_p99 = results["invoke_c1"].p99 - results["echo_c1"].p99
        floor_ratio = results["invoke_c16"].rps / results["floor_c16"].rps
        # MCP's own cost: the same call through /v1/mcp against /invoke, run beside it,
        # the median of the pairs' differences.
        pairs = [("mcp_c1", "invoke_c1")] + [
            (f"mcp_c1#{k}", f"invoke_c1#{k}") for k in range(2, MCP_PAIRS + 1)
        ]
        differences = sorted(results[m].p50 - results[i].p50 for m, i in pairs)
        mcp_added_p50 = differences[len(differences) // 2]
        print(
            "MCP over /invoke, p50 at c=1, pair by pair: "
            + ", ".join(f"{d:+.2f} ms" for d in differences)
        )
        mcp_ratio = results["mcp_c16"].rps / results["invoke_c16"].rps
        print(
            f"MCP tools/call over /invoke: +{mcp_added_p50:.2f} ms p50 at c=1 (target <= 0.30), "
            f"c=16 rate {mcp_ratio:.1%} of /invoke's (target >= 90 %)"
        )
        failed = bool(non2xx) or not audit_ok
        if failed:
            print("bench FAILED: non-2xx responses or an invalid audit chain")
        print(
            f"BENCH added_p50_ms={added_p50:.2f} added_p99_ms={added_p99:.2f} "
            f"rps_c16={results['invoke_c16'].rps:.0f} "
            f"same_tenant_rps_c16={results['same_tenant_c16'].rps:.0f} "
            f"floor_ratio={floor_ratio:.3f} mcp_added_p50_ms={mcp_added_p50:.2f} "
            f"mcp_rps_ratio_c16={mcp_ratio:.3f} non2xx={non2xx}",
            flush=True,
        )
        return 1 if failed else 0
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    finally:
        procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
