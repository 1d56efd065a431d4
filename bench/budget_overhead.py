"""What a monthly budget adds to an invoke: N in-process calls (Django test client) of a
builtin tool costing 0.001 EUR, for a tenant without a budget and one with a budget
(interleaved in blocks, so load drifts hit both alike). Prints p50 wall time and CPU per
call. Creates its tenants in the database it is given, which must be a scratch one:
`EAI_DATABASE_URL=postgres://…/scratch` or `EAI_SQLITE_PATH=/tmp/scratch.sqlite3`, then
`.venv/bin/python bench/budget_overhead.py .` (CALLS=1000 for more calls)."""

import os
import statistics
import sys
import time

if not (os.environ.get("EAI_DATABASE_URL") or os.environ.get("EAI_SQLITE_PATH")):
    sys.exit("set EAI_DATABASE_URL or EAI_SQLITE_PATH to a scratch database")
project = sys.argv[1] if len(sys.argv) > 1 else "."
sys.path.insert(0, project)
os.chdir(project)
os.environ["DJANGO_SETTINGS_MODULE"] = "eai.settings"
import django  # noqa: E402

django.setup()
from decimal import Decimal  # noqa: E402

from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

call_command("migrate", verbosity=0)
from gateway.keys import issue_api_key  # noqa: E402
from gateway.manifests import apply_manifests  # noqa: E402
from tenants.models import Tenant  # noqa: E402

TOOL = {
    "apiVersion": "eai/v1",
    "kind": "Tool",
    "metadata": {"name": "paid.echo", "version": "1.0.0"},
    "spec": {
        "input_schema": {"type": "object"},
        "endpoint": {"type": "builtin", "callable": "echo"},
        "cost": {"amount": "0.001", "currency": "EUR"},
        "idempotent": True,
    },
}
clients = {}
for slug, budget in (("nobudget", None), ("budget", Decimal("1000000"))):
    tenant = Tenant.objects.filter(slug=slug).first() or Tenant.objects.create(slug=slug, name=slug)
    tenant.monthly_budget = budget
    tenant.save()
    apply_manifests(tenant=tenant, documents=[TOOL])
    _, raw = issue_api_key(tenant=tenant, scopes=["tools:invoke"], agent="bench")
    clients[slug] = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {raw}")

N = int(os.environ.get("CALLS", "600"))
walls = {k: [] for k in clients}
cpus = {k: [] for k in clients}
for _ in range(50):
    for c in clients.values():
        c.post("/v1/tools/paid.echo/invoke", '{"input": {}}', content_type="application/json")
for _block in range(N // 20):
    for slug, c in clients.items():
        for _ in range(20):
            w, p = time.perf_counter(), time.process_time()
            r = c.post(
                "/v1/tools/paid.echo/invoke", '{"input": {}}', content_type="application/json"
            )
            walls[slug].append(time.perf_counter() - w)
            cpus[slug].append(time.process_time() - p)
            assert r.status_code == 200, r.content
for slug in clients:
    print(
        f"{slug:9} p50 {statistics.median(walls[slug]) * 1e3:.3f} ms wall, "
        f"mean CPU {statistics.mean(cpus[slug]) * 1e3:.3f} ms"
    )
