"""A live gateway for the SDKs' tests: `python sdk/testing/gateway.py [--config-out F] -- CMD…`.

Starts the gateway (the embedded default: `manage.py serve`) on a free port with a
temporary database and keys of its own, seeds what `sdk/scenarios.json` needs, runs CMD
with `EAI_SDK_TEST_CONFIG` naming a JSON file:

    {"base_url": "http://127.0.0.1:PORT", "scenarios": "/…/sdk/scenarios.json",
     "keys": {"agent": "eai_…", "reviewer": "eai_…", "other_tenant": "eai_…"}}

then stops it. It never touches a running `make run` (its own ports, database, key
files and anchor log). Without CMD it serves until interrupted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SCOPES = [
    "tools:invoke",
    "tools:read",
    "invocations:read",
    "events:read",
    "audit:read",
    "contracts:validate",
    "manifests:apply",
    "finops:read",
    "finops:write",
    "approvals:read",
    "jira:read",
    "payments:write",
    "crm:read",
]
EXTRA_TOOLS = {
    "manifests": [
        {
            "apiVersion": "eai/v1",
            "kind": "Tool",
            "metadata": {"name": "limited.echo", "version": "1.0.0", "description": "Echo, 1/s"},
            "spec": {
                "input_schema": {"type": "object"},
                "endpoint": {"type": "builtin", "callable": "echo"},
                "rate_limit": {"requests": 1, "per": "1s", "scope": "tenant"},
                "idempotent": True,
            },
        },
    ]
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def key(env: dict[str, str], tenant: str, scopes: list[str], *extra: str) -> str:
    line = manage(
        env, "create_api_key", "--tenant", tenant, "--scopes", ",".join(scopes), "--json", *extra
    )
    return json.loads(line.strip().splitlines()[-1])["key"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-out", help="Where to write the JSON config (default: temp).")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command

    work = Path(tempfile.mkdtemp(prefix="eai-sdk-gateway-"))
    port, upstream = free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EAI_", "DJANGO_", "PROMETHEUS_", "OTEL_"))
    }
    env.update(
        {
            "EAI_SQLITE_PATH": str(work / "db.sqlite3"),
            "EAI_SECRET_KEY": secrets.token_urlsafe(50),
            "EAI_AUDIT_SIGNING_KEY": base64.b64encode(os.urandom(32)).decode(),
            "EAI_AUDIT_ANCHOR_PATH": str(work / "anchors.jsonl"),
            "EAI_METRICS_TOKEN": secrets.token_urlsafe(24),
            "EAI_DEMO_UPSTREAM_PORT": str(upstream),
            "EAI_ALLOWED_HOSTS": "127.0.0.1,localhost",
        }
    )
    base_url = f"http://127.0.0.1:{port}"
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "demo", "--upstream-port", str(upstream), "--base-url", base_url)
    extra = work / "extra-tools.json"
    extra.write_text(json.dumps(EXTRA_TOOLS))
    manage(env, "apply_manifests", "--tenant", "acme", str(extra))
    config = {
        "base_url": base_url,
        "scenarios": str(ROOT / "sdk" / "scenarios.json"),
        "keys": {
            "agent": key(env, "acme", SCOPES, "--agent", "sdk-tests"),
            "reviewer": key(
                env, "acme", ["approvals:read", "approvals:decide"], "--user", "reviewer"
            ),
            "other_tenant": key(env, "globex", SCOPES, "--agent", "sdk-tests"),
        },
    }
    config_path = Path(options.config_out or work / "config.json")
    config_path.write_text(json.dumps(config, indent=2))

    log = open(work / "server.log", "wb")  # noqa: SIM115 - the server's, closed in finally
    server = subprocess.Popen(
        [PYTHON, "manage.py", "serve", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        for _ in range(200):
            try:
                # S310: a loopback http URL this script built.
                with urllib.request.urlopen(f"{base_url}/readyz", timeout=1) as response:  # noqa: S310
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            print((work / "server.log").read_text(), file=sys.stderr)
            return 1
        print(f"gateway for the SDK tests on {base_url}; config {config_path}", file=sys.stderr)
        if not command:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
            return 0
        return subprocess.run(
            command, env={**os.environ, "EAI_SDK_TEST_CONFIG": str(config_path)}
        ).returncode
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
