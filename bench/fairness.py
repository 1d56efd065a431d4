"""Two tenants under attack: tenant B's call latency and `/healthz`, before and during
an attack by tenant A, in both postures (SPEC §14).

    .venv/bin/python bench/fairness.py [--postures embedded,production] [--seconds 10]
                                        [--root PATH]   # another checkout, e.g. an older one

For each posture it starts the gateway on a free loopback port:
- embedded: `manage.py serve` (what `make run` runs) on a SQLite file in a temporary
  folder;
- production: `gunicorn eai.wsgi -w 2 -k eai.workers.InlineWorker` (README, "PostgreSQL,
  step by step") on PostgreSQL (127.0.0.1:5432, user postgres: database `eai_fairness`,
  roles `eai_fair_owner`/`eai_fair_app`, dropped and made again) and Redis db 8;
then seeds two tenants: `attacker` (tool `slow`, an upstream that answers after 600 s,
`timeout_ms` 600000) and `victim` (tool `echo`, an upstream that answers at once); the
upstreams run in this process. It measures B (`victim`: sequential invokes of `echo`)
and `/healthz` for `--seconds`, then under two attacks, for `--seconds` each:
- `saturate`: 64 clients of A calling `slow` in a loop, each again after the 429's
  `Retry-After`; 32 connections sending a request head a byte a second, 32 more a
  body a byte a second, each opening a new one when cut off;
- `flood`: the same, A's clients calling again at once when refused.
It prints, per posture and phase, B's and `/healthz`'s p50, p95 and worst latency,
requests that failed or timed out (30 s), and what A got (calls served, 429s, trickling
connections cut). All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
PG_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DB_NAME = "eai_fairness"
OWNER, APP = "eai_fair_owner", "eai_fair_app"
PASSWORD = secrets.token_hex(16)
REDIS_URL = "redis://127.0.0.1:6379/8"
TIMEOUT_S = 30.0

SEED = """
import json
from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from tenants.models import Tenant

def tool(name, url, timeout_ms):
    return {"apiVersion": "eai/v1", "kind": "Tool",
            "metadata": {"name": name, "version": "1.0.0"},
            "spec": {"input_schema": {"type": "object"},
                     "endpoint": {"type": "http", "url": url, "method": "POST",
                                  "timeout_ms": timeout_ms},
                     "risk_class": "low", "idempotent": True}}

keys = {}
for slug, name, url, timeout_ms in (("attacker", "slow", "%(slow)s", 600000),
                                    ("victim", "echo", "%(fast)s", 5000)):
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
    apply_manifests(tenant=tenant, documents=[tool(name, url, timeout_ms)], actor="bench")
    _, keys[slug] = issue_api_key(tenant=tenant, scopes=["tools:invoke"], agent="bench")
print("FAIRNESS_SEED " + json.dumps(keys))
"""


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b"{}"
        if self.path.startswith("/slow"):
            time.sleep(600)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_upstream() -> str:
    server = ThreadingHTTPServer((HOST, 0), _Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://{HOST}:{server.server_address[1]}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def run(argv: list[str], env: dict[str, str], root: Path, stdin: str | None = None) -> str:
    result = subprocess.run(
        argv, cwd=root, env=env, input=stdin, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        tail = result.stdout[-2000:] + result.stderr[-3000:]
        raise SystemExit(f"{' '.join(argv[:4])} failed:\n{tail}")
    return result.stdout


class Posture:
    def __init__(self, name: str, root: Path, upstream: str) -> None:
        self.name = name
        self.root = root
        self.python = str(Path(sys.executable))
        self.upstream = upstream
        self.tmp = Path(tempfile.mkdtemp(prefix=f"eai-fairness-{name}-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        base = {k: v for k, v in os.environ.items() if not k.startswith(("EAI_", "DJANGO_"))}
        self.env = {**base, "PYTHONUNBUFFERED": "1", "EAI_ALLOWED_HOSTS": "127.0.0.1,localhost"}

    def setup(self) -> dict[str, str]:
        python = self.python
        if self.name == "embedded":
            self.env["EAI_SQLITE_PATH"] = str(self.tmp / "db.sqlite3")
            run([python, "manage.py", "migrate", "--noinput"], self.env, self.root)
        else:
            admin = PG_ADMIN_URL
            subprocess.run(
                ["psql", admin, "-qc", f'DROP DATABASE IF EXISTS "{DB_NAME}"'],
                check=True, capture_output=True,
            )  # fmt: skip
            where = "127.0.0.1:5432"
            self.env.update(
                EAI_DATABASE_URL=f"postgres://{APP}:{PASSWORD}@{where}/{DB_NAME}",
                EAI_DB_APP_ROLE=APP,
                EAI_REDIS_URL=REDIS_URL,
            )
            run(
                [python, "manage.py", "setup_postgres", "--admin-url", admin,
                 "--database-name", DB_NAME, "--owner", OWNER, "--app", APP,
                 "--owner-password", PASSWORD, "--app-password", PASSWORD],
                self.env, self.root,
            )  # fmt: skip
            owner = f"postgres://{OWNER}:{PASSWORD}@{where}/{DB_NAME}"
            run(
                [python, "manage.py", "migrate", "--database", "migrate", "--noinput"],
                {**self.env, "EAI_MIGRATE_DATABASE_URL": owner},
                self.root,
            )
        seed = SEED % {"slow": self.upstream + "/slow", "fast": self.upstream + "/fast"}
        out = run([python, "manage.py", "shell"], self.env, self.root, stdin=seed)
        match = re.search(r"^FAIRNESS_SEED (.+)$", out, re.M)
        if match is None:
            raise SystemExit(f"seeding failed: {out[-2000:]}")
        return json.loads(match[1])

    def start(self) -> None:
        if self.name == "embedded":
            argv = [self.python, "manage.py", "serve", "--bind", f"{HOST}:{self.port}",
                    "--no-upstream"]  # fmt: skip
        else:
            gunicorn = str(Path(sys.executable).parent / "gunicorn")
            argv = [gunicorn, "eai.wsgi", "-w", "2", "-k", "eai.workers.InlineWorker",
                    "-b", f"{HOST}:{self.port}", "--timeout", "700"]  # fmt: skip
        self.proc = subprocess.Popen(
            argv,
            cwd=self.root,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if request(self.port, "GET", "/healthz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.name}: the gateway did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def request(port: int, method: str, path: str, body: bytes | None = None,
            key: str | None = None, timeout: float = TIMEOUT_S) -> tuple[int, bytes]:  # fmt: skip
    conn = HTTPConnection(HOST, port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def measure(port: int, victim_key: str, seconds: float) -> dict[str, list[float | None]]:
    """B's invokes and /healthz, alternately, one at a time, for `seconds`: latencies
    in ms (None: failed or timed out)."""
    out: dict[str, list[float | None]] = {"B invoke": [], "/healthz": []}
    body = json.dumps({"input": {"msg": "hello"}}).encode()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for label, call in (
            ("B invoke", lambda: request(port, "POST", "/v1/tools/echo/invoke", body, victim_key)),
            ("/healthz", lambda: request(port, "GET", "/healthz")),
        ):
            started = time.monotonic()
            try:
                status, _ = call()
                out[label].append((time.monotonic() - started) * 1000 if status == 200 else None)
            except OSError:
                out[label].append(None)
    return out


class Attack:
    def __init__(self, port: int, attacker_key: str, polite: bool) -> None:
        self.port = port
        self.key = attacker_key
        self.polite = polite
        self.stop = threading.Event()
        self.statuses: Counter[str] = Counter()
        self.cut = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._caller, daemon=True) for _ in range(64)]
        head = (
            f"POST /v1/tools/slow/invoke HTTP/1.1\r\nHost: {HOST}\r\n"
            f"Authorization: Bearer {attacker_key}\r\nContent-Type: application/json\r\n"
            "Content-Length: 64\r\n\r\n"
        ).encode()
        body = b'{"input": {}}'.ljust(64)  # longer than a byte a second gets in by the deadline
        self.threads += [
            threading.Thread(target=self._trickler, args=(data,), daemon=True)
            for data in [head + body] * 32 + [body] * 32
        ]
        self.head = head

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _count(self, what: str) -> None:
        with self.lock:
            self.statuses[what] += 1

    def _caller(self) -> None:
        body = json.dumps({"input": {}}).encode()
        while not self.stop.is_set():
            try:
                status, _ = request(self.port, "POST", "/v1/tools/slow/invoke", body, self.key, 700)
                self._count(str(status))
                if self.polite and status == 429:
                    time.sleep(1.0)  # its Retry-After
            except OSError:
                self._count("error")
                time.sleep(0.1)

    def _trickler(self, data: bytes) -> None:
        whole_head = not data.startswith(b"POST")
        while not self.stop.is_set():
            try:
                sock = socket.create_connection((HOST, self.port), timeout=5)
            except OSError:
                time.sleep(0.5)
                continue
            try:
                if whole_head:
                    sock.sendall(self.head)
                sock.settimeout(1.0)
                for byte in data:
                    if self.stop.is_set():
                        return
                    sock.sendall(bytes([byte]))
                    try:
                        if sock.recv(65536) == b"":
                            break
                        break  # an answer (408): cut off
                    except TimeoutError:
                        continue
                with self.lock:
                    self.cut += 1
            except OSError:
                with self.lock:
                    self.cut += 1
            finally:
                sock.close()


def summary(values: list[float | None]) -> str:
    ok = sorted(v for v in values if v is not None)
    failed = len(values) - len(ok)
    if not ok:
        return f"n={len(values)} all failed"
    p95 = ok[min(len(ok) - 1, int(len(ok) * 0.95))]
    return (
        f"n={len(values):4d} p50 {statistics.median(ok):8.1f} ms  p95 {p95:8.1f} ms  "
        f"max {ok[-1]:8.1f} ms  failed {failed}"
    )


def attack_main(port: int, attacker_key: str, mode: str) -> int:
    """The attack, in a process of its own (its threads would otherwise slow the
    measuring client down through the GIL): runs until stdin closes, then prints what
    A got."""
    attack = Attack(port, attacker_key, polite=mode == "saturate")
    attack.start()
    sys.stdin.read()
    attack.stop.set()
    with attack.lock:
        print(json.dumps({"statuses": attack.statuses, "cut": attack.cut}), flush=True)
    os._exit(0)  # the callers still wait on their 600 s calls


def attacked(port: int, keys: dict[str, str], mode: str, seconds: float) -> tuple[dict, dict]:
    """B and /healthz measured while A attacks (`saturate`: its slow calls retried
    after its Retry-After; `flood`: at once). A's 600 s calls stay in flight until the
    server stops, so the second phase starts with A's share already held."""
    attacker = subprocess.Popen(
        [sys.executable, __file__, "--attack", str(port), keys["attacker"], mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3.0)  # the attack reaches its steady state
        during = measure(port, keys["victim"], seconds)
        got, _ = attacker.communicate("", timeout=60)
    finally:
        if attacker.poll() is None:
            attacker.kill()
    return during, json.loads(got.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postures", default="embedded,production")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--attack", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        return attack_main(int(args.attack[0]), args.attack[1], args.attack[2])
    root = Path(args.root).resolve()
    upstream = start_upstream()
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"checkout {root} ({commit}); load average {os.getloadavg()[0]:.1f}", flush=True)
    for name in args.postures.split(","):
        posture = Posture(name, root, upstream)
        phases: dict[str, dict] = {}
        reports: dict[str, dict] = {}
        try:
            keys = posture.setup()
            posture.start()
            phases["before"] = measure(posture.port, keys["victim"], args.seconds)
            for mode in ("saturate", "flood"):
                phases[mode], reports[mode] = attacked(posture.port, keys, mode, args.seconds)
        finally:
            posture.stop()
        print(f"\n{name}:")
        for label in ("B invoke", "/healthz"):
            for phase, values in phases.items():
                print(f"  {label:9s} {phase:9s} {summary(values[label])}")
        for mode, report in reports.items():
            print(f"  A during {mode}: answers {report['statuses'] or 'none'}; "
                  f"trickling connections cut off: {report['cut']}", flush=True)  # fmt: skip
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
