"""A tenant's policy modules are decided under a budget (SPEC §14): past it the call is
denied, fail-closed, with a clear reason; the module version is flagged for staff; each
later call is still decided under the budget; a new version clears the flag.

Real rego-cpp in real evaluator processes. CPU is measured as the CPU of this process's
children (`RUSAGE_CHILDREN`: an evaluator ended at its budget is waited for, so its CPU
counts), never as wall-clock time. Personas: Alice's agent (acme) owns the costly
modules; Bob's agent (globex) must never notice them."""

from __future__ import annotations

import copy
import json
import os
import resource
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from gateway import policy, policy_evaluators
from gateway.models import AuditEvent, Decision, PolicyModule
from tenants.models import Membership
from tenants.scope import tenant_scope

from .conftest import error_of, scope

LONG_RUN_ID = "r" * 200  # the longest run_id an agent may send (SPEC §1)

# Cheap for every call a trial makes (its run_id is at most `run_` and 24 hex digits),
# about 7 s of CPU for a call that sends a 200-character run_id: 1,500² steps.
BURN = (
    "package eai.tool\n\nimport rego.v1\n\n"
    'wide := split(concat("", [input.request.run_id | some _ in split("0123456", "")]), "")\n'
    'deny contains "never" if {\n'
    "\tcount(input.request.run_id) > 150\n"
    "\tsome a in wide\n\tsome b in wide\n"
    '\tconcat("", [a, b]) == "##"\n'
    "}\n"
)
# Memory for a long run_id: 200 × 8⁷ characters (400 MiB) in one string.
MEMORY_BOMB = (
    "package eai.tool\n\nimport rego.v1\n\n"
    'x8(s) := concat("", [s, s, s, s, s, s, s, s])\n'
    'deny contains "never" if {\n'
    "\tcount(input.request.run_id) > 150\n"
    "\tcount(x8(x8(x8(x8(x8(x8(x8(input.request.run_id)))))))) < 0\n"
    "}\n"
)
# No gate at all: (5 × len(run_id))² steps, 20k for a trial's run_id, 1M for 200 chars.
QUADRATIC = (
    "package eai.tool\n\nimport rego.v1\n\n"
    'five := split(concat("", [input.request.run_id | some _ in split("01234", "")]), "")\n'
    'deny contains "never" if {\n'
    "\tsome a in five\n\tsome b in five\n"
    '\tconcat("", [a, b]) == "##"\n'
    "}\n"
)
CHEAP = (
    "package eai.tool\n\nimport rego.v1\n\n"
    'deny contains "agent blocked" if {\n\tinput.principal.agent == "rogue"\n}\n'
)


def policy_manifest(rego: str, version: str = "1", name: str = "guard") -> dict:
    return {
        "apiVersion": "eai/v1",
        "kind": "Policy",
        "metadata": {"name": name, "version": version},
        "spec": {"rego": rego},
    }


def apply(api, manifest):
    response = api.post("/v1/manifests/apply", manifest)
    assert response.status_code == 200, response.content
    return response


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def module_of(tenant, name: str = "guard") -> PolicyModule:
    with tenant_scope(tenant, readonly=True):
        return PolicyModule.objects.get(tenant=tenant, name=name)


@pytest.fixture(autouse=True)
def _evaluators_ended():
    """Each test starts and ends with no idle evaluator (another test's stay warm)."""
    policy_evaluators.pool().close()
    yield
    policy_evaluators.pool().close()


def test_it_denies_a_module_past_its_cpu_budget_flags_it_and_keeps_deciding(alice, bob):
    apply(alice, policy_manifest(BURN))
    before = children_cpu()
    response = alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
    spent = children_cpu() - before
    error = error_of(response)
    assert response.status_code == 403 and error["code"] == "policy_denied"
    # 250 ms of budget plus an evaluator's start; unbounded, the module takes ~7 s.
    assert spent < 2.5, spent
    assert "used more than 250 ms of CPU in a decision" in error["message_i18n"]["en"]
    assert "plus de 250 ms de CPU pour une décision" in error["message_i18n"]["fr"]
    with scope(alice.key.tenant):
        decision = Decision.objects.get(pk=error["decision_id"])
    assert not decision.allow
    assert decision.reasons == [
        "policy budget exceeded: the tenant's policy modules used more than 250 ms of CPU"
        " in a decision"
    ]
    assert decision.policy_version.startswith("sha256:")
    with tenant_scope(alice.key.tenant, readonly=True):
        chained = AuditEvent.objects.get(tenant=alice.key.tenant, object_ref=decision.id)
    assert chained.action == "policy.decision"
    assert json.loads(chained.canonical)["payload"]["reasons"] == decision.reasons
    flagged = module_of(alice.key.tenant)
    assert flagged.budget_exceeded_at is not None
    assert "250 ms of CPU" in flagged.budget_exceeded_reason

    # The next call is decided again, under the budget: denied again, as fast.
    before = children_cpu()
    again = alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
    assert children_cpu() - before < 2.5
    assert error_of(again)["code"] == "policy_denied"
    with scope(alice.key.tenant):
        assert Decision.objects.get(pk=error_of(again)["decision_id"]).reasons == decision.reasons
    # A call the module decides cheaply is not blocked by the flag.
    assert alice.invoke("jira.search", {"q": "x"}, run_id="run_short").status_code == 200

    # A new version clears the flag and decides that same call.
    apply(alice, policy_manifest(CHEAP, version="2"))
    assert module_of(alice.key.tenant).budget_exceeded_at is None
    assert module_of(alice.key.tenant).budget_exceeded_reason == ""
    assert alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID).status_code == 200
    # Bob's tenant has no module and was never flagged or slowed.
    assert bob.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID).status_code == 200


def test_reapplying_the_same_version_keeps_the_flag(alice):
    apply(alice, policy_manifest(BURN))
    alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
    flagged_at = module_of(alice.key.tenant).budget_exceeded_at
    assert flagged_at is not None
    body = apply(alice, policy_manifest(BURN)).json()
    assert body["results"][0]["status"] == "unchanged"
    assert module_of(alice.key.tenant).budget_exceeded_at == flagged_at


def test_it_denies_a_module_past_its_memory_budget(alice, settings):
    settings.EAI_POLICY_CPU_MS = 20_000  # so that memory is the bound reached
    apply(alice, policy_manifest(MEMORY_BOMB))
    response = alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
    error = error_of(response)
    assert response.status_code == 403 and error["code"] == "policy_denied"
    assert "used more than 256 MiB of memory in a decision" in error["message_i18n"]["en"]
    assert "plus de 256 Mio de mémoire" in error["message_i18n"]["fr"]
    assert "256 MiB of memory" in module_of(alice.key.tenant).budget_exceeded_reason
    # The evaluator it killed is replaced: the next cheap call is decided.
    assert alice.invoke("jira.search", {"q": "x"}, run_id="run_ok").status_code == 200


def test_a_module_quadratic_in_the_agents_input_is_bounded(alice):
    """The closing note's case: cheap on the trial's input, costly on a large one."""
    apply(alice, policy_manifest(QUADRATIC))
    assert alice.invoke("jira.search", {"q": "x"}, run_id="run_a").status_code == 200
    before = children_cpu()
    response = alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
    assert children_cpu() - before < 2.5
    assert error_of(response)["code"] == "policy_denied"
    assert module_of(alice.key.tenant).budget_exceeded_at is not None


def test_a_tenant_without_modules_is_decided_in_process(alice, bob):
    """The hot path pays nothing for the budget: no evaluator is started or asked."""
    apply(alice, policy_manifest(CHEAP))
    before = children_cpu()
    pool = policy_evaluators.pool()
    started = pool._count
    for _ in range(20):
        assert bob.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID).status_code == 200
    assert pool._count == started and children_cpu() == before
    body = bob.invoke("jira.search", {"q": "x"}).json()
    with scope(bob.key.tenant):
        version = Decision.objects.get(pk=body["decision_id"]).policy_version
    assert version == policy.compiled_policy([]).version


@pytest.mark.django_db(transaction=True)
def test_another_tenant_is_served_while_one_tenants_module_burns(alice, bob, settings):
    """Alice's costly calls hold at most her share of the evaluators (one of two here):
    her excess is refused at once (429), while Bob, whose own module also needs an
    evaluator, is decided as usual."""
    settings.EAI_POLICY_EVALUATORS = 2
    settings.EAI_POLICY_CPU_MS = 4_000  # long enough to overlap Bob's calls
    apply(alice, policy_manifest(BURN))
    apply(bob, policy_manifest(CHEAP))
    assert bob.invoke("jira.search", {"q": "x"}).status_code == 200  # its evaluator started
    outcome: dict[str, object] = {}

    def burn() -> None:
        try:
            outcome["burn"] = alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
        finally:
            connection.close()  # this thread's own, or the test database stays in use

    burner = threading.Thread(target=burn)
    burner.start()
    try:
        # Wait until Alice's call holds its evaluator (her share: one).
        pool = policy_evaluators.pool()
        for _ in range(2000):
            if pool._held.get(str(alice.key.tenant_id)):
                break
            threading.Event().wait(0.005)
        assert pool._held.get(str(alice.key.tenant_id)) == 1
        excess = alice.invoke("jira.search", {"q": "x"}, run_id="run_second")
        assert excess.status_code == 429, excess.content
        assert error_of(excess)["code"] == "rate_limited" and excess["Retry-After"] == "1"
        served = [bob.invoke("jira.search", {"q": "x"}).status_code for _ in range(5)]
        still_burning = burner.is_alive()
    finally:
        burner.join(timeout=120)
    assert served == [200] * 5
    assert still_burning, "Alice's call ended before Bob's calls: nothing was shown"
    assert error_of(outcome["burn"])["code"] == "policy_denied"


def test_a_burning_module_does_not_take_another_tenants_warm_evaluator(alice, bob):
    """Alice's module ends its evaluator at each call; Bob's evaluator, idle between his
    calls, stays his (it has his policy), so he never waits for a new one to start."""
    apply(alice, policy_manifest(BURN))
    apply(bob, policy_manifest(CHEAP))
    assert bob.invoke("jira.search", {"q": "x"}).status_code == 200
    pool = policy_evaluators.pool()
    (bobs,) = [e.proc.pid for e in pool._idle]
    for _ in range(2):
        burnt = alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
        assert error_of(burnt)["code"] == "policy_denied"
        assert bobs in [e.proc.pid for e in pool._idle]
    assert bob.invoke("jira.search", {"q": "x"}).status_code == 200
    assert [e.proc.pid for e in pool._idle] == [bobs]


OLD_TRIAL_TELLS = [
    'input.tool.name != "trial"',
    'input.principal.tenant != "ten_trial"',
    'input.principal.key_id != "key_trial"',
    'input.context.request_id != "req_trial"',
    'input.request.input_digest != "hmac-sha256:'
    '0000000000000000000000000000000000000000000000000000000000000000"',
    'input.context.time != "2026-01-01T00:00:00+00:00"',
]


@pytest.mark.parametrize("tell", OLD_TRIAL_TELLS)
def test_the_trial_call_cannot_be_told_by_the_old_fixed_values(alice, tell):
    """A module that skipped the old, published trial input burns on the new one, so
    apply refuses it, on the invoke budget."""
    rego = (
        "package eai.tool\n\nimport rego.v1\n\n"
        'wide := split(concat("", [input.tool.name | some _ in split("0123456789", "")]), "")\n'
        'deny contains "never" if {\n'
        f"\t{tell}\n"
        "\tsome a in wide\n\tsome b in wide\n\tsome c in wide\n"
        '\tconcat("", [a, b, c]) == "###"\n'
        "}\n"
    )
    response = alice.post("/v1/manifests/apply", policy_manifest(rego))
    assert response.status_code == 422, response.content
    error = error_of(response)["details"]["errors"][0]
    assert error["path"] == "/spec/rego"
    assert "past the invoke budget (250 ms of CPU, 256 MiB a decision)" in error["message"]
    with scope(alice.key.tenant):
        assert not PolicyModule.objects.filter(tenant=alice.key.tenant).exists()


def test_the_trial_call_is_a_fresh_call_shaped_as_the_tenants_own(alice):
    from gateway.manifests import _trial_document

    first = _trial_document(alice.key.tenant, [])
    second = _trial_document(alice.key.tenant, [])
    assert first["principal"]["tenant"] == "acme"
    assert first["principal"]["key_id"] == alice.key.public_id
    assert first["tool"]["name"] in {"jira.search", "payments.transfer", "secret.tool"}
    assert "tools:invoke" in first["principal"]["scopes"]
    assert set(first["tool"]["scopes_required"]) <= set(first["principal"]["scopes"])
    assert first["context"]["request_id"] != second["context"]["request_id"]
    assert first["request"]["input_digest"] != second["request"]["input_digest"]
    made_up = policy.trial_document()
    assert made_up["tool"]["name"] != "trial" and made_up["principal"]["tenant"] != "ten_trial"


def test_staff_see_the_flag_in_the_admin(alice, bob, tenant_a):
    apply(alice, policy_manifest(BURN))
    apply(bob, policy_manifest(CHEAP, name="bobs"))
    alice.invoke("jira.search", {"q": "x"}, run_id=LONG_RUN_ID)
    # Applied after the call: not part of the decision that went past the budget.
    apply(alice, policy_manifest(CHEAP, name="fine"))
    user = get_user_model().objects.create_user("olga", password="x" * 20, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_policymodule"))
    Membership.objects.create(user=user, tenant=tenant_a, role=Membership.ROLE_REVIEWER)
    client = Client()
    client.force_login(user)
    listing = client.get("/admin/gateway/policymodule/").content.decode()
    assert "budget exceeded at" in listing and "bobs" not in listing
    only = client.get("/admin/gateway/policymodule/?budget=exceeded").content.decode()
    assert "guard" in only and ">fine<" not in only
    page = client.get(f"/admin/gateway/policymodule/{module_of(tenant_a).pk}/change/")
    assert "budget exceeded at" in page.content.decode()
    assert "250 ms of CPU" in page.content.decode()


def test_a_stored_module_of_another_version_is_not_flagged(alice):
    """The flag names the version that ran: one applied since is left alone."""
    apply(alice, policy_manifest(BURN))
    source = module_of(alice.key.tenant).rego
    with tenant_scope(alice.key.tenant):
        count = PolicyModule.objects.for_tenant(alice.key.tenant).flag_budget_exceeded(
            [("guard", source + "\n# changed")], "x"
        )
    assert count == 0 and module_of(alice.key.tenant).budget_exceeded_at is None


def test_the_burn_module_passes_the_trial_so_the_invoke_budget_is_what_stops_it(alice):
    """The modules above are cheap on any trial call: what denies them is the budget at
    invoke, not apply."""
    for rego in (BURN, MEMORY_BOMB, QUADRATIC):
        manifest = copy.deepcopy(policy_manifest(rego))
        assert alice.post("/v1/manifests/apply", manifest).status_code == 200


class _TricklingOpa(BaseHTTPRequestHandler):
    """An OPA that answers its decision a byte every 0.2 s (40 s for all of it)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        return

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"result": {"allow": true, "reasons": [], "obligations": []}}'.ljust(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for byte in body:
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:
                return
            self.server.sent += 1
            time.sleep(0.2)


def test_a_slow_opa_answer_is_bounded_and_denies(alice, settings):
    """With EAI_OPA_URL the budget is OPA's timeout, for the whole answer: a socket
    timeout alone let a server trickling its body hold the call for 40 s."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TricklingOpa)
    server.sent = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings.EAI_OPA_URL = f"http://127.0.0.1:{server.server_address[1]}"
        settings.EAI_OPA_TIMEOUT_S = 0.5
        response = alice.invoke("jira.search", {"q": "x"})
        sent = server.sent
    finally:
        server.shutdown()
        server.server_close()
    error = error_of(response)
    assert response.status_code == 403 and error["code"] == "policy_denied"
    assert "the policy cannot be evaluated" in error["message_i18n"]["en"]
    with scope(alice.key.tenant):
        assert Decision.objects.get(pk=error["decision_id"]).policy_version == "error"
    # The call ended while the server was still sending its answer (generous: 0.5 s
    # of deadline against 40 s of answer).
    assert 0 < sent < 100, sent


def test_an_evaluator_killed_while_idle_blames_no_module(alice):
    """An evaluator ended from outside between calls (the OOM killer, an operator) is
    replaced: the call is decided, and nothing is flagged."""
    apply(alice, policy_manifest(CHEAP))
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    (idle,) = policy_evaluators.pool()._idle
    idle.proc.send_signal(signal.SIGKILL)
    idle.proc.wait()
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    assert module_of(alice.key.tenant).budget_exceeded_at is None
    (live,) = policy_evaluators.pool()._idle
    assert live.proc.pid != idle.proc.pid


LEAK = 'package eai.tool\n\nimport rego.v1\n\ndeny contains sprintf("%v", [opa.runtime()])\n'


def test_a_module_cannot_read_the_gateways_environment(alice, monkeypatch):
    """rego-cpp's `opa.runtime()` is its process's environment: apply refuses it, and a
    module stored before that check sees an evaluator's environment, not the server's
    (whose secret key and database password it would have put in a deny reason)."""
    monkeypatch.setenv("EAI_CANARY_SECRET", "canary-7f3a9c")
    response = alice.post("/v1/manifests/apply", policy_manifest(LEAK))
    assert response.status_code == 422
    assert "opa.runtime" in error_of(response)["details"]["errors"][0]["message"]
    with tenant_scope(alice.key.tenant):
        PolicyModule.objects.create(
            tenant=alice.key.tenant, name="leak", version="1", rego=LEAK, digest="leak"
        )
    response = alice.invoke("jira.search", {"q": "x"})
    error = error_of(response)
    assert error["code"] == "policy_denied"  # the module's own deny, whatever it says
    with scope(alice.key.tenant):
        stored = Decision.objects.get(pk=error["decision_id"]).reasons
    assert "canary-7f3a9c" not in response.content.decode() + json.dumps(stored)
    assert "EAI_SECRET_KEY" not in response.content.decode() + json.dumps(stored)


def test_a_module_that_prints_writes_nowhere(alice):
    """`print` is rego-cpp's standard output: an evaluator drops it, or a module printing
    in a loop at every call would grow a file of the server's without bound."""
    rego = (
        "package eai.tool\n\nimport rego.v1\n\n"
        'wide := split("0123456789012345678901234567890123456789", "")\n'
        'deny contains "never" if {\n\tsome a in wide\n\tsome b in wide\n'
        '\tprint("spam spam spam spam spam spam spam spam spam spam spam spam spam")\n'
        '\ta == "#"\n}\n'
    )
    apply(alice, policy_manifest(rego))
    for _ in range(3):
        assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    (evaluator,) = policy_evaluators.pool()._idle
    evaluator.stderr.seek(0, os.SEEK_END)
    assert evaluator.stderr.tell() == 0


def test_an_evaluator_that_gets_no_cpu_is_waited_for_a_bounded_time(alice):
    """A stopped evaluator (as one starved on a loaded machine) is given up on after
    max(5 s, 20 × the CPU budget): the call is denied, fail-closed, without blaming the
    module, and the next call is decided by a new evaluator."""
    apply(alice, policy_manifest(CHEAP))
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    (stopped,) = policy_evaluators.pool()._idle
    stopped.proc.send_signal(signal.SIGSTOP)
    response = alice.invoke("jira.search", {"q": "x"})
    error = error_of(response)
    assert response.status_code == 403 and error["code"] == "policy_denied"
    assert "did not decide within 5 s" in error["message_i18n"]["en"]
    assert "n’ont pas décidé en 5 s" in error["message_i18n"]["fr"]
    assert stopped.proc.returncode is not None  # ended, not left stopped
    assert module_of(alice.key.tenant).budget_exceeded_at is None
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
