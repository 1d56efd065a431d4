"""The Helm chart (deploy/helm/eai), rendered offline through Helm's own library
(helm-python-sdk), linted strictly and validated against Kubernetes' schemas
(kubernetes-validate), with each value set a platform team would use."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

helm_python = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "eai"
SENTINEL = "sentinel-s3cr3t-value-42"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "minimal": {"controlPlane": {"enabled": True}},
    "external_database": {
        "controlPlane": {"enabled": True},
        "postgresql": {"enabled": False},
        "externalDatabase": {
            "url": f"postgres://eai_app:{SENTINEL}@db.internal:5432/eai",
            "migrateUrl": f"postgres://eai_owner:{SENTINEL}@db.internal:5432/eai",
        },
    },
    "existing_secret": {
        "controlPlane": {"enabled": True, "existingSecret": "eai-prod-env"},
        "postgresql": {"enabled": False},
    },
    "everything_on": {
        "controlPlane": {
            "enabled": True,
            "config": {"EAI_ALLOWED_HOSTS": "gateway.example.com", "EAI_HTTPS": "1"},
            "secrets": {"EAI_SECRET_KEY": SENTINEL, "EAI_METRICS_TOKEN": SENTINEL + "m"},
            "autoscaling": {"enabled": True},
            "serviceMonitor": {"enabled": True},
            "ingress": {"enabled": True, "host": "gateway.example.com", "tlsSecretName": "tls"},
            "worker": {"replicas": 3},
        },
        "redis": {"enabled": True},
    },
    "everything_off": {
        "controlPlane": {
            "enabled": True,
            "networkPolicy": {"enabled": False},
            "podDisruptionBudget": {"enabled": False},
            "auditAnchors": {"persistence": {"enabled": False}},
            "serviceAccount": {"create": False},
        },
        "redis": {"enabled": False},
    },
}


def render(values: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    out = helm_python.Chart.load(CHART).render(values=values, name="rel", namespace="ns")
    docs, notes = [], ""
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs, notes


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job")
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(d["kind"], d["metadata"]["name"]) for d in docs])
    return found[0]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_it_lints_strictly_and_every_object_validates(name):
    report = helm_python.lint(str(CHART), VALUE_SETS[name], strict=True)
    assert report["errors"] == [], report
    docs, _ = render(VALUE_SETS[name])
    assert docs
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a CRD: not in Kubernetes' own schemas
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_it_renders_nothing_but_a_hint_when_the_control_plane_is_off():
    docs, notes = render({})
    assert docs == []
    assert "controlPlane.enabled=true" in notes
    docs, _ = render({"controlPlane": {"enabled": False}, "redis": {"enabled": True}})
    assert docs == []


def test_it_refuses_a_misspelt_or_out_of_range_key():
    for values in (
        {"controlPlane": {"enabeld": True}},
        {"controlPlane": {"enabled": True, "beat": {"replicas": 2}}},
        {"controlPlane": {"enabled": True}, "postgresql": {"enable": False}},
        {"controlPlane": {"enabled": True, "config": {"lower_case": "x"}}},
        {"controlPlane": {"enabled": True, "ingress": {"enabled": True}}},
    ):
        with pytest.raises(helm_python.HelmError):
            render(values)


def test_the_minimal_install_brings_its_own_postgresql_and_migrates_before_the_pods():
    docs, notes = render(VALUE_SETS["minimal"])
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("StatefulSet", "rel-eai-postgresql") in kinds
    assert ("Deployment", "rel-eai-api") in kinds
    pg = one(docs, "StatefulSet", "rel-eai-postgresql")
    assert pg["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    # The database and the generated keys exist before the Job that needs them.
    job = one(docs, "Job", "rel-eai-migrate")
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    weight = int(hooks["helm.sh/hook-weight"])
    for kind, name in (("StatefulSet", "rel-eai-postgresql"), ("Secret", "rel-eai-generated")):
        annotations = one(docs, kind, name)["metadata"]["annotations"]
        assert "pre-install" in annotations["helm.sh/hook"]
        assert int(annotations["helm.sh/hook-weight"]) < weight
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["setup-database"]
    env = {e["name"]: e for e in container["env"]}
    assert env["EAI_MIGRATE_DATABASE_URL"]["value"].startswith("postgres://eai_owner:")
    # Without Redis: one API process with in-process fallbacks, no worker or beat.
    api = one(docs, "Deployment", "rel-eai-api")
    assert api["spec"]["replicas"] == 1
    assert not [d for d in docs if d["metadata"]["name"] in ("rel-eai-worker", "rel-eai-beat")]
    assert "create_api_key" in notes and "/admin/" in notes


def test_pods_serve_as_the_app_role_and_only_the_job_holds_the_owner():
    for name in ("minimal", "everything_on"):
        docs, _ = render(VALUE_SETS[name])
        for pod_name, spec in pod_specs(docs):
            if "postgresql" in pod_name or "redis" in pod_name:
                continue
            env = {e["name"]: e for c in spec["containers"] for e in c.get("env", [])}
            assert env["EAI_DATABASE_URL"]["value"].startswith("postgres://eai_app:")
            assert ("EAI_MIGRATE_DATABASE_URL" in env) == (pod_name == "rel-eai-migrate")
            assert ("EAI_DB_ADMIN_URL" in env) == (pod_name == "rel-eai-migrate")


def test_with_redis_the_worker_and_beat_run_and_the_api_scales():
    docs, _ = render(VALUE_SETS["everything_on"])
    worker = one(docs, "Deployment", "rel-eai-worker")
    beat = one(docs, "Deployment", "rel-eai-beat")
    assert worker["spec"]["replicas"] == 3
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert one(docs, "StatefulSet", "rel-eai-redis")
    config = one(docs, "ConfigMap", "rel-eai")["data"]
    assert config["EAI_REDIS_URL"] == "redis://rel-eai-redis:6379/0"
    assert "gateway.example.com" in config["EAI_ALLOWED_HOSTS"].split(",")
    assert "localhost" in config["EAI_ALLOWED_HOSTS"].split(",")
    hpa = one(docs, "HorizontalPodAutoscaler", "rel-eai-api")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "rel-eai-api"
    assert "replicas" not in one(docs, "Deployment", "rel-eai-api")["spec"]  # the HPA's
    assert one(docs, "PodDisruptionBudget", "rel-eai-api")
    monitor = one(docs, "ServiceMonitor", "rel-eai")
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["key"] == (
        "EAI_METRICS_TOKEN"
    )
    assert one(docs, "Ingress", "rel-eai")["spec"]["rules"][0]["host"] == "gateway.example.com"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_secrets_appear_only_in_secrets(name):
    docs, notes = render(VALUE_SETS[name])
    encoded = base64.b64encode(SENTINEL.encode()).decode()[:16]
    for doc in docs:
        text = json.dumps(doc)
        if doc["kind"] == "Secret":
            continue
        assert SENTINEL not in text, (doc["kind"], doc["metadata"]["name"])
        assert encoded not in text
        for _pod, spec in pod_specs([doc]):
            for container in spec["containers"]:
                for entry in container.get("env", []):
                    # Secret values come through secretKeyRef; only derived URLs embed a
                    # $(VAR) that Kubernetes expands from a Secret.
                    if "PASSWORD" in entry["name"] or entry["name"].endswith("_KEY"):
                        assert "valueFrom" in entry, entry
    assert SENTINEL not in notes
    for secret in by_kind(docs, "Secret"):
        assert secret["type"] == "Opaque"
        for value in secret.get("data", {}).values():
            base64.b64decode(value, validate=True)
    config = "".join(json.dumps(c["data"]) for c in by_kind(docs, "ConfigMap"))
    for secret_name in ("EAI_SECRET_KEY", "EAI_AUDIT_SIGNING_KEY", "EAI_METRICS_TOKEN", "PASSWORD"):
        assert secret_name not in config


def test_generated_keys_are_kept_across_upgrades_and_uninstalls():
    docs, _ = render(VALUE_SETS["minimal"])
    generated = one(docs, "Secret", "rel-eai-generated")
    assert generated["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    data = generated["data"]
    signing = base64.b64decode(base64.b64decode(data["EAI_AUDIT_SIGNING_KEY"]))
    assert len(signing) == 32  # an Ed25519 seed
    assert {"EAI_SECRET_KEY", "POSTGRES_PASSWORD", "EAI_DB_APP_PASSWORD"} <= set(data)
    pvc = one(docs, "PersistentVolumeClaim", "rel-eai-anchors")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_pod_is_hardened(name):
    docs, _ = render(VALUE_SETS[name])
    for pod_name, spec in pod_specs(docs):
        assert spec["automountServiceAccountToken"] is False, pod_name
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, pod_name
            assert sc["readOnlyRootFilesystem"] is True, pod_name
            assert sc["allowPrivilegeEscalation"] is False, pod_name
            assert sc["privileged"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["limits"]["memory"]
            assert container["resources"]["requests"]["cpu"]
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            if "postgresql" not in pod_name and "redis" not in pod_name:
                assert {"/tmp", "/var/run/eai-metrics"} <= mounts
                assert sc["runAsUser"] == 10001


def test_the_api_is_probed_on_healthz_and_readyz_with_an_allowed_host():
    docs, _ = render(VALUE_SETS["everything_on"])
    container = one(docs, "Deployment", "rel-eai-api")["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    headers = {h["name"]: h["value"] for h in container["readinessProbe"]["httpGet"]["httpHeaders"]}
    assert headers["Host"] == "localhost"
    assert headers["X-Forwarded-Proto"] == "https"  # no redirect with EAI_HTTPS=1


def test_the_service_monitors_scrape_by_pod_ip_is_an_allowed_host():
    """Prometheus scrapes each pod at its IP, the request's Host then: the pod allows it
    (EAI_POD_IP from status.podIP), and /metrics is exempt from the HTTPS redirect."""
    import os
    import subprocess
    import sys

    docs, _ = render(VALUE_SETS["everything_on"])
    container = one(docs, "Deployment", "rel-eai-api")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["EAI_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    monitor = by_kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]
    assert monitor["path"] == "/metrics"
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'eai.settings'; django.setup()\n"
        "from django.conf import settings; from django.test import Client\n"
        "print('10.1.2.3' in settings.ALLOWED_HOSTS)\n"
        "r = Client().get('/metrics', HTTP_HOST='10.1.2.3:8000')\n"
        "print(r.status_code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "EAI_POD_IP": "10.1.2.3", "EAI_HTTPS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=CHART.parent.parent.parent,
        check=False,
    )
    assert out.stdout.split() == ["True", "401"], out.stderr[-2000:]  # not 400, not 301


def test_network_policies_keep_the_databases_to_the_gateway():
    docs, _ = render(VALUE_SETS["everything_on"])
    for component, port in (("postgresql", 5432), ("redis", 6379)):
        policy = one(docs, "NetworkPolicy", f"rel-eai-{component}")
        rule = policy["spec"]["ingress"][0]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        selector = rule["from"][0]["podSelector"]["matchExpressions"]
        assert {
            "key": "app.kubernetes.io/instance",
            "operator": "In",
            "values": ["rel"],
        } in selector
    api = one(docs, "NetworkPolicy", "rel-eai-api")
    assert api["spec"]["ingress"][0]["ports"] == [{"port": 8000, "protocol": "TCP"}]
    docs, _ = render(VALUE_SETS["everything_off"])
    assert by_kind(docs, "NetworkPolicy") == []
    assert by_kind(docs, "PodDisruptionBudget") == []


def test_an_external_database_needs_no_bundled_one_and_an_existing_secret_is_used_as_is():
    docs, _ = render(VALUE_SETS["external_database"])
    assert not [d for d in docs if "postgresql" in d["metadata"]["name"]]
    env_secret = one(docs, "Secret", "rel-eai-env")
    url = base64.b64decode(env_secret["data"]["EAI_DATABASE_URL"]).decode()
    assert url.startswith("postgres://eai_app:")
    job = one(docs, "Job", "rel-eai-migrate")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]

    docs, _ = render(VALUE_SETS["existing_secret"])
    assert not [d for d in docs if d["metadata"]["name"] == "rel-eai-env"]
    for _name, spec in pod_specs(docs):
        refs = [
            s["secretRef"]["name"] for s in spec["containers"][0]["envFrom"] if "secretRef" in s
        ]
        assert refs[-1] == "eai-prod-env"  # the user's keys win over the generated ones


def test_the_config_overrides_the_charts_defaults_without_duplicates():
    docs, _ = render(
        {"controlPlane": {"enabled": True, "config": {"EAI_SANDBOX_RUNTIME": "bwrap"}}}
    )
    config = one(docs, "ConfigMap", "rel-eai")["data"]
    assert config["EAI_SANDBOX_RUNTIME"] == "bwrap"
    docs, _ = render(VALUE_SETS["minimal"])
    assert one(docs, "ConfigMap", "rel-eai")["data"]["EAI_SANDBOX_RUNTIME"] == "off"


def test_the_images_runtime_lock_is_generated_from_requirements_lock():
    """deploy/requirements-runtime.lock is the runtime part of requirements.lock: the
    project's dependencies and what they need, nothing else (run deploy/runtime_lock.py)."""
    import subprocess
    import sys

    root = CHART.parent.parent.parent
    fresh = subprocess.run(
        [sys.executable, str(root / "deploy" / "runtime_lock.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (root / "deploy" / "requirements-runtime.lock").read_text() == fresh
    assert "pytest" not in fresh and "mutmut" not in fresh and "Django==" in fresh
