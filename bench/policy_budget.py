"""CPU a policy decision costs, per call: the default policy alone (in process), and a
tenant's module decided by an evaluator process under the budget, against the same
module decided in process as it was before the budget.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=eai.settings .venv/bin/python bench/policy_budget.py
"""

from __future__ import annotations

import os
import threading
import time

import django

django.setup()

from gateway import policy, policy_evaluators  # noqa: E402

N = 3000
DOCUMENT = {
    "principal": {
        "key_id": "key_x",
        "agent": "a",
        "scopes": ["tools:invoke", "jira:read"],
        "tenant": "acme",
        "user": False,
    },
    "tool": {
        "name": "jira.search",
        "version": "1.0.0",
        "scopes_required": ["jira:read"],
        "requires_approval": False,
        "risk_class": "low",
    },
    "request": {"run_id": "run_1", "step_index": 0, "input_digest": "hmac-sha256:00"},
    "context": {"request_id": "req_1", "time": "2026-12-01T00:00:00+00:00"},
}
MODULES = [
    (
        "tenant.rego",
        "package eai.tool\nimport rego.v1\n"
        'deny contains "rogue" if input.principal.agent == "rogue"\n',
    )
]


def evaluator_cpu() -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for evaluator in policy_evaluators.pool()._idle:
        with open(f"/proc/{evaluator.proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def per_call(label: str, run) -> None:
    run()  # warm: compile, start the evaluator
    own, theirs = time.process_time(), evaluator_cpu()
    for _ in range(N):
        run()
    own = (time.process_time() - own) / N * 1e6
    theirs = (evaluator_cpu() - theirs) / N * 1e6
    total = own + theirs
    print(f"{label:<46} server {own:6.1f} µs  evaluator {theirs:6.1f} µs  total {total:6.1f} µs")


per_call("default policy only (no tenant module)", lambda: policy.evaluate(DOCUMENT, []))
per_call("tenant module, evaluator process (budget)", lambda: policy.evaluate(DOCUMENT, MODULES))
bundle = policy.compiled_policy(MODULES).bundle
per_call(
    "tenant module, in process (before, unbounded)",
    lambda: (
        policy._memoized(policy.compiled_policy([]), DOCUMENT),
        policy._query(policy._interpreter(), bundle, DOCUMENT),
    ),
)


# Tenant B's decisions (a cheap module, so B needs an evaluator too; and none) while
# tenant A sends a module that burns CPU from 4 threads at once (A holds at most half
# of the evaluators, the rest of its calls are refused at once).
BURN = [
    (
        "burn.rego",
        "package eai.tool\nimport rego.v1\n"
        'wide := split(concat("", [input.request.run_id | some _ in split("0123456", "")]), "")\n'
        'deny contains "never" if {\n\tcount(input.request.run_id) > 150\n'
        "\tsome a in wide\n\tsome b in wide\n"
        '\tconcat("", [a, b]) == "##"\n}\n',
    )
]
BURNING = {**DOCUMENT, "request": {**DOCUMENT["request"], "run_id": "r" * 200}}


def latencies(label: str, run, n: int = 200) -> None:
    run()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000)
        time.sleep(0.005)
    samples.sort()
    print(f"{label:<46} p50 {samples[n // 2]:6.2f} ms  p99 {samples[n * 99 // 100]:6.2f} ms")


def burner(stop: threading.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            policy.evaluate(BURNING, BURN, tenant="a")
        except policy.PolicyBudgetExceeded:
            counts["denied"] += 1
        except policy.PolicyBusy:
            counts["busy"] += 1
            time.sleep(0.01)


B_MODULES = [("b.rego", MODULES[0][1])]
latencies("B, no module, A idle", lambda: policy.evaluate(DOCUMENT, [], tenant="b"))
latencies("B, cheap module, A idle", lambda: policy.evaluate(DOCUMENT, B_MODULES, tenant="b"))
stop, counts = threading.Event(), {"denied": 0, "busy": 0}
threads = [threading.Thread(target=burner, args=(stop, counts)) for _ in range(4)]
for thread in threads:
    thread.start()
time.sleep(1)
latencies("B, no module, A burning", lambda: policy.evaluate(DOCUMENT, [], tenant="b"))
latencies("B, cheap module, A burning", lambda: policy.evaluate(DOCUMENT, B_MODULES, tenant="b"))
stop.set()
for thread in threads:
    thread.join()
print(
    f"A's calls meanwhile: {counts['denied']} denied past the budget, {counts['busy']} refused busy"
)
policy_evaluators.pool().close()
