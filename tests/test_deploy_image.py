"""The container image `make image` builds (deploy/Containerfile), run here with buildah:
non-root, no compiler, a HEALTHCHECK; `check --deploy` passes with production settings;
the bundled-database role sets up PostgreSQL's roles and migrates; the API answers
/healthz and /readyz from inside it.

Runs when EAI_TEST_IMAGE=1 (after `make image`; CI does both), and then fails if the
image is missing; skipped otherwise (each run copies the image: about two minutes)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

IMAGE = os.environ.get("EAI_IMAGE_TAG", "localhost/eai-tool-gateway:dev")
BUILDAH = ["buildah", "--storage-driver", "vfs"]
WANTED = os.environ.get("EAI_TEST_IMAGE") == "1"
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"


def _image_present() -> bool:
    if not shutil.which("buildah") or os.geteuid() != 0:
        return False
    found = subprocess.run([*BUILDAH, "inspect", "--type", "image", IMAGE], capture_output=True)
    return found.returncode == 0


@pytest.fixture(scope="module")
def image_config():
    if not WANTED:
        pytest.skip("set EAI_TEST_IMAGE=1 after `make image` to run the image")
    if not _image_present():
        pytest.fail(f"image {IMAGE} is missing: run `make image` first")
    out = subprocess.run(
        [*BUILDAH, "inspect", "--type", "image", IMAGE], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def container(image_config):
    """One working container for the module: each `buildah from` copies the image."""
    name = subprocess.run(
        [*BUILDAH, "from", IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    yield name
    subprocess.run([*BUILDAH, "rm", name], capture_output=True)


def run_in(container: str, env: dict[str, str], *argv: str, timeout: int = 120):
    flags = [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
    return subprocess.run(
        [
            *BUILDAH,
            "run",
            "--isolation",
            "chroot",
            "--user",
            "10001:10001",
            *flags,
            container,
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def production_env() -> dict[str, str]:
    return {
        "EAI_SECRET_KEY": secrets.token_urlsafe(50),
        "EAI_HTTPS": "1",
        "EAI_ALLOWED_HOSTS": "gateway.example.com,127.0.0.1,localhost",
        "EAI_METRICS_TOKEN": secrets.token_urlsafe(24),
        # Production sets the signing key (the chart generates one): the root
        # filesystem is read-only, so no key file can be made.
        "EAI_AUDIT_SIGNING_KEY": base64.b64encode(os.urandom(32)).decode(),
    }


def test_it_runs_as_a_fixed_non_root_user_with_a_healthcheck(image_config, container):
    config = image_config["Docker"]["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/usr/local/bin/eai-entrypoint"]
    assert config["Cmd"] == ["api"]
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])
    who = run_in(container, {}, "id", "-u")
    assert who.stdout.strip() == "10001"
    # No compiler or build tools in the final stage.
    tools = run_in(container, {}, "sh", "-c", "command -v gcc cc make g++ pip3 apt-get; true")
    assert [t for t in tools.stdout.split() if "apt-get" not in t] == []
    # Nothing of the app is writable by its user.
    writable = run_in(container, {}, "sh", "-c", "find /app /opt/venv -writable | head -n 5")
    assert writable.stdout.strip() == ""


def test_check_deploy_passes_with_production_settings(container):
    result = run_in(
        container,
        {**production_env(), "EAI_DATABASE_URL": PG_ADMIN},
        "eai-entrypoint",
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_sets_up_the_database_and_serves_healthz_and_readyz(container):
    name = "eai_image_" + secrets.token_hex(4)
    app_password, owner_password = secrets.token_hex(12), secrets.token_hex(12)
    setup_env = {
        **production_env(),
        "EAI_DB_ADMIN_URL": PG_ADMIN,
        "EAI_DB_NAME": name,
        "EAI_DB_OWNER_PASSWORD": owner_password,
        "EAI_DB_APP_PASSWORD": app_password,
        "EAI_DB_APP_ROLE": f"{name}_app",
        "EAI_DB_OWNER_ROLE": f"{name}_owner",
        "EAI_DATABASE_URL": f"postgres://{name}_app:{app_password}@127.0.0.1:5432/{name}",
        "EAI_MIGRATE_DATABASE_URL": f"postgres://{name}_owner:{owner_password}@127.0.0.1:5432/{name}",
    }
    port = free_port()
    server = None
    try:
        setup = run_in(container, setup_env, "eai-entrypoint", "setup-database", timeout=300)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        assert app_password not in setup.stdout + setup.stderr
        assert owner_password not in setup.stdout + setup.stderr
        serve_env = {
            k: v for k, v in setup_env.items() if not k.startswith(("EAI_DB_ADMIN", "EAI_MIGRATE"))
        }
        serve_env.update(
            {"EAI_BIND": f"127.0.0.1:{port}", "EAI_REDIS_URL": "redis://127.0.0.1:6379/7"}
        )
        flags = [arg for key, value in serve_env.items() for arg in ("--env", f"{key}={value}")]
        server = subprocess.Popen(
            [
                *BUILDAH,
                "run",
                "--isolation",
                "chroot",
                "--user",
                "10001:10001",
                *flags,
                container,
                "--",
                "eai-entrypoint",
                "api",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        body = None
        for _ in range(120):
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/readyz",
                    headers={"Host": "localhost", "X-Forwarded-Proto": "https"},
                )
                with urllib.request.urlopen(request, timeout=2) as response:
                    body = json.loads(response.read())
                    break
            except OSError:
                time.sleep(0.5)
        assert body is not None, "the API never answered"
        assert body["checks"]["database"] == "ok"
        assert body["checks"]["redis"] == "ok"
        # The image's own HEALTHCHECK command, run inside it.
        health = run_in(
            container,
            {"EAI_BIND": f"127.0.0.1:{port}"},
            "python3",
            "-c",
            "import urllib.request as u; "
            f"r = u.Request('http://127.0.0.1:{port}/healthz', "
            "headers={'Host': 'localhost', 'X-Forwarded-Proto': 'https'}); "
            "print(u.urlopen(r, timeout=4).read().decode())",
        )
        assert health.returncode == 0, health.stderr
        assert json.loads(health.stdout) == {"status": "ok"}
    finally:
        if server is not None:
            os.killpg(server.pid, 15)
            server.wait(timeout=30)
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-q",
                "-c",
                f"DROP DATABASE IF EXISTS {name}",
                "-c",
                f"DROP ROLE IF EXISTS {name}_app",
                "-c",
                f"DROP ROLE IF EXISTS {name}_owner",
            ],
            capture_output=True,
        )
