"""Policy decisions (Rego package `eai.tool`, decision `tool.invoke`).

The default module is compiled once into a regopy bundle and queried in process through
its entrypoint; each thread keeps its own interpreter (rego-cpp interpreters are not
shared across threads). A tenant's `kind: Policy` modules, with the default, are decided
by an evaluator process under a CPU and memory budget (`gateway.policy_evaluators`):
rego-cpp cannot be stopped once a query runs. With EAI_OPA_URL set, the decision comes
from the OPA server instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from regopy import Interpreter

from eai.integrations import opa
from gateway import policy_evaluators
from gateway.rego import (
    DEFAULT_POLICY,
    ENTRYPOINT,
    PolicyError,
    compile_bundle,
    query_decision,
)


@dataclass(frozen=True)
class PolicyResult:
    allow: bool
    reasons: list[str]
    obligations: list[dict[str, Any]]
    missing_scopes: list[str] = field(default_factory=list)

    def has_obligation(self, kind: str) -> bool:
        return any(o.get("type") == kind for o in self.obligations)


@dataclass(frozen=True)
class CompiledPolicy:
    version: str
    bundle: Any


_default_source = DEFAULT_POLICY.read_text()
_compiled: dict[str, CompiledPolicy] = {}
_compile_lock = threading.Lock()
_local = threading.local()


def policy_version(modules: list[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for name, source in modules:
        digest.update(name.encode() + b"\0" + source.encode() + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


def check_module(source: str, sample: dict[str, Any] | None = None) -> str | None:
    """Why a tenant module cannot be used (compile error, wrong package, a rule of the
    default policy redefined, a decision that cannot be evaluated, that allows what the
    default policy denies, or that goes past the invoke budget on a trial call), or None.

    `sample` is a decision input as a real call of the tenant would send it (see
    `trial_document`); it is tried as is and without any scope."""
    first = next(
        (line.strip() for line in source.splitlines() if line.strip().startswith("package ")),
        "",
    )
    if first != "package eai.tool":
        return "a policy module must declare 'package eai.tool'"
    redefined = _BASE_RULE_RE.search(source)
    if redefined:
        return (
            f"a policy module adds 'deny' or 'obligations' rules; it cannot redefine"
            f" '{redefined.group(1)}' of the default policy"
        )
    code = _REGO_STRINGS_AND_COMMENTS.sub(" ", source)
    if _UNBOUNDED_RE.search(code):
        return "a policy module cannot use numbers.range: its size has no bound"
    if _RUNTIME_RE.search(code):
        return "a policy module cannot use opa.runtime: it describes the gateway's process"
    sample = sample if sample is not None else trial_document()
    # A tenant's rules only add denials and obligations, so a caller with no scope at
    # all must still be denied: a module that makes the default's decision unreadable or
    # lifts its denial (two conflicting values, say) would do so for every call.
    unscoped = {**sample, "principal": {**sample["principal"], "scopes": []}}
    modules = [("eai_tool.rego", _default_source), ("tenant.rego", source)]
    outcome = _bounded_trial(modules, [unscoped, sample])
    if "error" in outcome:
        return str(outcome["error"])
    decision = outcome["decisions"][0]
    if decision["allow"] or "tools:invoke" not in decision["missing_scopes"]:
        return "a policy module cannot allow what the default policy denies"
    return None


def tool_input(name: str, version: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`input.tool` of a decision, for a tool's name, version and normalized spec."""
    return {
        "name": name,
        "version": version,
        "scopes_required": spec["scopes_required"],
        "requires_approval": spec["requires_approval"],
        "risk_class": spec["risk_class"],
        "action_class": spec["action_class"],
        "network": spec["network"],
        "idempotent": spec["idempotent"],
        "endpoint_type": spec["endpoint"]["type"],
        "cost": spec["cost"],
    }


# Words of the tool names a trial makes up when the tenant has no tool yet.
_TRIAL_WORDS = [
    "crm",
    "billing",
    "jira",
    "mail",
    "files",
    "calendar",
    "search",
    "ledger",
    "tickets",
    "orders",
    "payments",
    "docs",
    "inventory",
    "hr",
    "support",
    "wiki",
    "lookup",
    "read",
    "write",
    "create",
    "update",
    "list",
    "send",
    "refund",
    "query",
]


def trial_document(
    *,
    tenant: str = "",
    principal: dict[str, Any] | None = None,
    tool: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A decision input for apply's trial call, fresh and random each time, shaped as
    a real call's: the tenant's own slug, one of its keys and tools when given, and a
    made-up realistic key and tool otherwise. A module cannot tell it from a real call by
    a fixed value (the trial used to be `input.tool.name == "trial"`, so a module that
    tested for that name skipped the trial and ran its costly part only at invoke).
    The principal holds every scope the tool asks for, so the call is one the default
    policy allows and the module's own rules all run."""
    rng = secrets.SystemRandom()
    if tool is None:
        words = rng.sample(_TRIAL_WORDS, 2)
        action = rng.choice(["read", "write", "execute"])
        tool = {
            "name": f"{words[0]}.{words[1]}",
            "version": f"{rng.randint(0, 3)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}",
            "scopes_required": [f"{words[0]}:{'read' if action == 'read' else 'write'}"],
            "requires_approval": False,
            "risk_class": rng.choice(["low", "medium", "high"]),
            "action_class": action,
            "network": rng.choice(["internal", "external"]),
            "idempotent": action == "read",
            "endpoint_type": rng.choice(["http", "http", "builtin"]),
            "cost": {"amount": f"{rng.randint(0, 500) / 100:.2f}", "currency": "EUR"},
        }
    if principal is None:
        principal = {
            "key_id": "key_" + "".join(rng.choices(_ALNUM, k=16)),
            "agent": rng.choice(["", f"agent-{secrets.token_hex(3)}"]),
            "scopes": ["tools:invoke"],
            "tenant": tenant or f"{rng.choice(_TRIAL_WORDS)}-{secrets.token_hex(2)}",
            "user": False,
        }
    scopes = sorted({*principal["scopes"], "tools:invoke", *tool["scopes_required"]})
    run_id = rng.choice([None, f"run_{secrets.token_hex(rng.randint(4, 12))}"])
    return {
        "principal": {**principal, "scopes": scopes},
        "tool": tool,
        "request": {
            "run_id": run_id,
            "step_index": rng.randint(0, 20) if run_id else None,
            "input_digest": "hmac-sha256:" + secrets.token_hex(32),
        },
        "context": {
            "request_id": "req_" + secrets.token_hex(12),
            "time": datetime.now(UTC).isoformat(),
        },
    }


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


# Built-ins whose result grows with an argument (a range of 10^8 numbers is 24 GB): the
# `numbers` namespace has nothing else, so any mention of it, outside strings and
# comments, is refused (`numbers["range"]`, `with r as numbers.range` included).
_UNBOUNDED_RE = re.compile(r"(?<![\w.])(numbers)(?!\w)")
# The `opa` namespace has only `opa.runtime()`: the evaluating process's environment and
# configuration, none of a tenant's business (and, in the server's process, its secrets).
_RUNTIME_RE = re.compile(r"(?<![\w.])(opa)(?!\w)")
_REGO_STRINGS_AND_COMMENTS = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|#[^\n]*')
TRIAL_SECONDS = 10.0
TRIAL_BYTES = 1 << 30  # resident memory


def _bounded_trial(
    modules: list[tuple[str, str]], documents: list[dict[str, Any]]
) -> dict[str, Any]:
    """Compile `modules` and decide each of `documents` in a process of its own
    (`gateway.policy_trial`): each decision under the invoke budget (`budget()`), the
    whole killed past TRIAL_SECONDS or TRIAL_BYTES."""
    limits = budget()
    request = json.dumps({"modules": modules, "documents": documents}).encode()
    root = str(Path(__file__).resolve().parent.parent)
    env = policy_evaluators.child_environment(
        EAI_TRIAL_SECONDS=str(TRIAL_SECONDS),  # the trial's own alarm, past ours
        EAI_TRIAL_CPU_S=str(limits.cpu_seconds),
        EAI_TRIAL_MEMORY=str(limits.memory_bytes),
    )
    over_budget = (
        "policy evaluation went past the invoke budget "
        f"({limits.cpu_seconds * 1000:.0f} ms of CPU, {limits.memory_bytes >> 20} MiB a decision) "
        "on a trial call"
    )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.policy_trial"],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=root,
            env=env,
        )
        try:
            try:
                proc.stdin.write(request)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            deadline = time.monotonic() + TRIAL_SECONDS
            while proc.poll() is None:
                if time.monotonic() > deadline or _resident_bytes(proc.pid) > TRIAL_BYTES:
                    return {
                        "error": "policy evaluation exceeded its bounds "
                        f"({TRIAL_SECONDS:.0f} s, {TRIAL_BYTES >> 20} MiB) on a trial call"
                    }
                time.sleep(0.02)
        finally:
            if proc.poll() is None:  # past a bound, or this process is being stopped
                proc.kill()
                proc.wait()
        out.seek(0)
        try:
            outcome = json.loads(out.read() or b"{}")
        except ValueError:
            outcome = {}
        err.seek(0, os.SEEK_END)
        err.seek(max(0, err.tell() - 4096))
        said = err.read()
    # SIGPROF: the CPU budget's timer; an allocation past the address-space limit.
    if proc.returncode == -signal.SIGPROF or b"bad_alloc" in said or b"MemoryError" in said:
        return {"error": over_budget}
    if proc.returncode != 0 or not ("error" in outcome or "decisions" in outcome):
        return {"error": "policy evaluation failed on a trial call"}
    return outcome


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# A rule head naming one of the default policy's own rules, which a tenant module may
# not define again (`name :=`, `name =`, `name contains`, `name if`, `name {`,
# `name[key] := …`, with or without `default`); references such as `name == …` or
# `name[_]` in a body are not heads.
_BASE_RULE_RE = re.compile(
    r"^[ \t]*(?:default[ \t]+)?(decision|required_scopes|missing_scopes)"
    r"(?:[ \t]*(?::=|=(?!=)|contains\b|if\b|\{)|\[[^\]\n]*\][ \t]*(?::=|=(?!=)|if\b|\{))",
    re.M,
)


def _query(interpreter: Interpreter, bundle: Any, document: dict[str, Any]) -> PolicyResult:
    return _result(query_decision(interpreter, bundle, document))


def compiled_policy(tenant_modules: list[tuple[str, str]]) -> CompiledPolicy:
    """The compiled bundle for the default module plus `tenant_modules` (cached)."""
    modules = [("eai_tool.rego", _default_source), *tenant_modules]
    version = policy_version(modules)
    policy = _compiled.get(version)
    if policy is None:
        with _compile_lock:
            policy = _compiled.get(version)
            if policy is None:
                policy = CompiledPolicy(version=version, bundle=compile_bundle(modules))
                _compiled[version] = policy
    return policy


def _interpreter() -> Interpreter:
    interpreter = getattr(_local, "interpreter", None)
    if interpreter is None:
        interpreter = _local.interpreter = Interpreter()
    return interpreter


class PolicyBudgetExceeded(PolicyError):
    """The tenant's modules went past the decision's budget: `kind` is "cpu", "memory"
    or "time"; `version` is the policy that was being decided."""

    def __init__(self, kind: str, version: str, budget: policy_evaluators.Budget) -> None:
        self.kind = kind
        self.version = version
        self.budget = budget
        limit = {
            "cpu": f"{budget.cpu_seconds * 1000:.0f} ms of CPU",
            "memory": f"{budget.memory_bytes >> 20} MiB of memory",
            "time": f"{budget.wall_seconds:.0f} s of waiting",
        }[kind]
        super().__init__(f"{BUDGET_REASON}{limit} in a decision")


class PolicyBusy(Exception):
    """The tenant already holds its share of policy evaluators (or none freed in time):
    nothing was decided, the caller may retry."""


# The reason stored with a decision the budget ended; the agent reads it translated.
BUDGET_REASON = "policy budget exceeded: the tenant's policy modules used more than "


def budget() -> policy_evaluators.Budget:
    cpu = settings.EAI_POLICY_CPU_MS / 1000
    # The wait is a backstop for an evaluator that gets no CPU (a loaded machine), far
    # past what its CPU budget takes.
    return policy_evaluators.Budget(
        cpu_seconds=cpu,
        memory_bytes=settings.EAI_POLICY_MEMORY_MB << 20,
        wall_seconds=max(5.0, 20 * cpu),
    )


def evaluate(
    document: dict[str, Any], tenant_modules: list[tuple[str, str]], *, tenant: str = ""
) -> tuple[PolicyResult, str]:
    """Decide `tool.invoke` for `document`; returns the result and the policy version.

    The default policy alone is decided in this process; with `tenant_modules` the
    combined decision is made by an evaluator process under `budget()`
    (PolicyBudgetExceeded past it, PolicyBusy when the tenant holds its share of
    evaluators)."""
    if settings.EAI_OPA_URL:
        try:
            raw = opa.evaluate(ENTRYPOINT, document)
        except opa.OpaError as exc:
            raise PolicyError(str(exc)) from exc
        return _result(raw), "opa:" + str(raw.get("policy_version", "remote"))
    base_policy = compiled_policy([])
    base = _memoized(base_policy, document)
    if not tenant_modules:
        return base, base_policy.version
    # A tenant's modules share the package with the default, so they could shadow what
    # it uses (a built-in such as `count`, or a rule) and lift its denial or drop its
    # obligations. The default is therefore decided alone, and the combined bundle may
    # only add: both must allow, and both decisions' reasons and obligations are kept.
    version = policy_version([("eai_tool.rego", _default_source), *tenant_modules])
    owner = tenant or str(document["principal"]["tenant"])
    combined = _decide_elsewhere(owner, version, tenant_modules, document)
    added = [o for o in combined.obligations if o not in base.obligations]
    result = PolicyResult(
        allow=base.allow and combined.allow,
        reasons=sorted(set(base.reasons) | set(combined.reasons)),
        obligations=sorted([*base.obligations, *added], key=json.dumps),
        missing_scopes=base.missing_scopes,
    )
    return result, version


def _decide_elsewhere(
    tenant: str, version: str, modules: list[tuple[str, str]], document: dict[str, Any]
) -> PolicyResult:
    """The default-plus-tenant decision, made by an evaluator process under the budget."""
    limits = budget()
    size = max(1, settings.EAI_POLICY_EVALUATORS)
    try:
        answer = policy_evaluators.pool().decide(
            tenant,
            version,
            modules,
            document,
            limits,
            size=size,
            per_tenant=max(1, size // 2),
        )
    except policy_evaluators.BudgetExceeded as exc:
        raise PolicyBudgetExceeded(exc.kind, version, limits) from None
    except policy_evaluators.EvaluatorsBusy:
        raise PolicyBusy from None
    except policy_evaluators.EvaluatorFailed as exc:
        raise PolicyError(f"policy evaluation failed: the evaluator {exc}") from None
    if "error" in answer:
        raise PolicyError(str(answer["error"])[:400])
    raw = answer.get("decision")
    if not isinstance(raw, dict):
        raise PolicyError("policy evaluation failed: the decision is not an object")
    return _result(raw)


def principal_input(key: Any) -> dict[str, Any]:
    """The decision input's `principal` for an API key."""
    return {
        "key_id": key.public_id,
        "agent": key.agent,
        "scopes": key.scopes,
        "tenant": key.tenant.slug,
        "user": bool(key.user_id),
    }


def missing_scopes(principal: dict[str, Any], tool: dict[str, Any]) -> list[str]:
    """The scopes the default policy finds missing for `principal` calling `tool`: the
    scope predicate of every decision (a tenant's modules cannot redefine it). The MCP
    `tools/list` lists a tool only when this is empty, and `evaluate` takes the
    decision's `missing_scopes` from the same query, so the list and the call never
    disagree about scopes."""
    document = {
        "principal": principal,
        "tool": tool,
        "request": {"run_id": None, "step_index": None, "input_digest": ""},
        "context": {"request_id": "", "time": ""},
    }
    if settings.EAI_OPA_URL:
        try:
            return _result(opa.evaluate(ENTRYPOINT, document)).missing_scopes
        except opa.OpaError as exc:
            raise PolicyError(str(exc)) from exc
    return _memoized(compiled_policy([]), document).missing_scopes


def _memoized(policy: CompiledPolicy, document: dict[str, Any]) -> PolicyResult:
    """The default policy's decision, reused for documents alike in what it reads."""
    memo_key = _memo_key(document)
    if memo_key is not None:
        cached = _memo.get((policy.version, memo_key))
        if cached is not None:
            return cached
    result = _query(_interpreter(), policy.bundle, document)
    if memo_key is not None:
        if len(_memo) >= MEMO_SIZE:
            _memo.clear()
        _memo[(policy.version, memo_key)] = result
    return result


# The default policy alone reads only these inputs, so its result for them can be
# reused (each call still gets and stores its own decision). A tenant's own modules may
# read anything (request, context), so with them every call is evaluated.
MEMO_SIZE = 4096
_memo: dict[tuple[str, str], PolicyResult] = {}


def _memo_key(document: dict[str, Any]) -> str | None:
    tool = document.get("tool", {})
    try:
        return json.dumps(
            [
                sorted(document["principal"]["scopes"]),
                sorted(tool.get("scopes_required", [])),
                tool.get("requires_approval"),
                tool.get("risk_class"),
            ]
        )
    except (KeyError, TypeError):
        return None


def _result(raw: dict[str, Any]) -> PolicyResult:
    obligations = raw.get("obligations") or []
    if not isinstance(obligations, list):
        obligations = []
    return PolicyResult(
        allow=raw.get("allow") is True,
        reasons=[str(r) for r in raw.get("reasons") or []],
        obligations=sorted(
            (o for o in obligations if isinstance(o, dict)), key=lambda o: json.dumps(o)
        ),
        missing_scopes=[str(s) for s in raw.get("missing_scopes") or []],
    )
