"""deploy/compose.yaml, checked with the Compose tool's own validation (`docker-compose
config`, Debian's package) and against its Compose Specification schema: no container
engine runs here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "deploy" / "compose.yaml"
SPEC = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")
SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret",
    "EAI_DB_OWNER_PASSWORD": "owner-secret",
    "EAI_DB_APP_PASSWORD": "app-secret",
    "EAI_SECRET_KEY": "django-secret",
    "EAI_AUDIT_SIGNING_KEY": "c2lnbmluZy1rZXktb2YtMzItYnl0ZXMtZXhhY3RseSE=",
    "EAI_METRICS_TOKEN": "metrics-secret",
}
REQUIRED = os.environ.get("EAI_REQUIRE_DEPLOY_TOOLS") == "1"


def tool() -> str:
    found = shutil.which("docker-compose")
    if not found:
        if REQUIRED:
            pytest.fail("docker-compose is not installed (apt-get install docker-compose)")
        pytest.skip("docker-compose is not installed")
    return found


def config(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS and not k.startswith("EAI_")}
    return subprocess.run(
        [tool(), "-p", "eai", "-f", str(COMPOSE), "--env-file", str(env_file), *args, "config"],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
    )


def test_it_is_a_valid_compose_file_with_and_without_the_optional_profiles(tmp_path):
    plain = config(tmp_path, SECRETS)
    assert plain.returncode == 0, plain.stderr
    resolved = yaml.safe_load(plain.stdout)["services"]
    services = {"postgres", "redis", "migrate", "gateway", "worker", "beat"}
    assert services <= set(resolved)
    # OPA and OpenBao only in their profiles (`config` lists them either way).
    assert {name for name, s in resolved.items() if s.get("profiles")} == {"opa", "openbao"}
    full = config(tmp_path, SECRETS, "--profile", "opa", "--profile", "openbao")
    assert full.returncode == 0, full.stderr
    resolved = yaml.safe_load(full.stdout)
    assert set(resolved["services"]) == services | {"opa", "openbao"}
    if SPEC.exists():
        jsonschema.validate(yaml.safe_load(COMPOSE.read_text()), json.loads(SPEC.read_text()))


def test_it_refuses_to_start_without_its_secrets(tmp_path):
    for missing in SECRETS:
        env = {k: v for k, v in SECRETS.items() if k != missing}
        result = config(tmp_path, env)
        assert result.returncode != 0, missing
        assert missing in result.stderr


def test_the_gateway_roles_share_one_hardened_image_and_the_chart_environment(tmp_path):
    resolved = yaml.safe_load(config(tmp_path, SECRETS).stdout)["services"]
    roles = {"gateway": ["api"], "worker": ["worker"], "beat": ["beat"]}
    images = {resolved[name]["image"] for name in [*roles, "migrate"]}
    assert len(images) == 1
    for name, command in roles.items():
        service = resolved[name]
        assert service["command"] == command
        assert service["read_only"] is True
        assert service["user"] == "10001:10001"
        assert service["cap_drop"] == ["ALL"]
        env = service["environment"]
        # The app role under row-level security; the owner only in the migrate service.
        assert env["EAI_DATABASE_URL"].startswith("postgres://eai_app:")
        assert "EAI_MIGRATE_DATABASE_URL" not in env
        assert env["EAI_REDIS_URL"] == "redis://redis:6379/0"
        assert env["EAI_AUDIT_ANCHOR_PATH"].startswith("/var/lib/eai/anchors/")
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    migrate = resolved["migrate"]
    assert migrate["command"] == ["setup-database"]
    assert migrate["environment"]["EAI_MIGRATE_DATABASE_URL"].startswith("postgres://eai_owner:")
    # Only the API publishes a port, on loopback unless told otherwise.
    published = [name for name, s in resolved.items() if s.get("ports")]
    assert published == ["gateway"]
    assert str(resolved["gateway"]["ports"][0]).startswith("127.0.0.1:8000:8000")
