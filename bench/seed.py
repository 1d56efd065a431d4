"""Seed the bench database; run as `manage.py shell < bench/seed.py` (run.py does).

Creates tenants bench-01 … bench-NN (EAI_BENCH_TENANTS, default 16), one `tools:invoke`
key each, and in each a low-risk `http` tool `echo` pointing at EAI_BENCH_ECHO_URL.
Prints one JSON line `BENCH_SEED {"keys": [...]}` for the driver (raw keys, in tenant
order). Bench-only: it lives here, not in the apps.
"""

import json
import os

from gateway.keys import issue_api_key
from gateway.manifests import apply_manifests
from tenants.models import Tenant

ECHO_URL = os.environ["EAI_BENCH_ECHO_URL"]
TENANTS = int(os.environ.get("EAI_BENCH_TENANTS", "16"))

ECHO_MANIFEST = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {"name": "echo", "version": "1.0.0", "description": "Bench echo upstream"},
    "spec": {
        "input_schema": {"type": "object"},
        "endpoint": {"type": "http", "url": ECHO_URL, "method": "POST", "timeout_ms": 5000},
        "risk_class": "low",
        "action_class": "read",
        "idempotent": True,
        "requires_approval": False,
    },
}

keys = []
for index in range(1, TENANTS + 1):
    slug = f"bench-{index:02d}"
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": f"Bench {index}"})
    apply_manifests(tenant=tenant, documents=[ECHO_MANIFEST], actor="bench")
    _, raw = issue_api_key(
        tenant=tenant, scopes=["tools:invoke"], agent="bench", name=f"bench key {index}"
    )
    keys.append(raw)

print("BENCH_SEED " + json.dumps({"keys": keys}))
