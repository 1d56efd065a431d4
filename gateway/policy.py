"""Policy decisions (Rego package `eai.tool`, decision `tool.invoke`).

In process, the default module plus the tenant's `kind: Policy` modules are compiled
once per policy version into a regopy bundle and queried through its entrypoint; each
thread keeps its own interpreter (rego-cpp interpreters are not shared across threads).
With EAI_OPA_URL set, the decision comes from the OPA server instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from regopy import Input, Interpreter

from eai.integrations import opa

DEFAULT_POLICY = Path(__file__).with_name("policies") / "eai_tool.rego"
ENTRYPOINT = "eai/tool/decision"


class PolicyError(Exception):
    """The policy could not be compiled or evaluated; the gateway fails closed (deny)."""


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


def check_module(source: str) -> str | None:
    """Why a tenant module cannot be used (compile error, wrong package, a rule of the
    default policy redefined, a decision that cannot be evaluated or that allows what
    the default policy denies), or None."""
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
    if _UNBOUNDED_RE.search(_REGO_STRINGS_AND_COMMENTS.sub(" ", source)):
        return "a policy module cannot use numbers.range: its size has no bound"
    # A tenant's rules only add denials and obligations, so a caller with no scope at
    # all must still be denied: a module that makes the default's decision unreadable or
    # lifts its denial (two conflicting values, say) would do so for every call.
    outcome = _bounded_trial([("eai_tool.rego", _default_source), ("tenant.rego", source)])
    if "error" in outcome:
        return str(outcome["error"])
    decision = outcome["decision"]
    if decision["allow"] or "tools:invoke" not in decision["missing_scopes"]:
        return "a policy module cannot allow what the default policy denies"
    return None


# Built-ins whose result grows with an argument (a range of 10^8 numbers is 24 GB): the
# `numbers` namespace has nothing else, so any mention of it, outside strings and
# comments, is refused (`numbers["range"]`, `with r as numbers.range` included).
_UNBOUNDED_RE = re.compile(r"(?<![\w.])(numbers)(?!\w)")
_REGO_STRINGS_AND_COMMENTS = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|#[^\n]*')
TRIAL_SECONDS = 10.0
TRIAL_BYTES = 1 << 30  # resident memory


def _bounded_trial(modules: list[tuple[str, str]]) -> dict[str, Any]:
    """Compile `modules` and decide the trial document in a process of its own
    (`gateway.policy_trial`), killed past TRIAL_SECONDS or TRIAL_BYTES."""
    request = json.dumps({"modules": modules, "document": _TRIAL_DOCUMENT}).encode()
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["EAI_TRIAL_SECONDS"] = str(TRIAL_SECONDS)  # the trial's own alarm, past ours
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.policy_trial"],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.DEVNULL,
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
    if proc.returncode != 0 or not ("error" in outcome or "decision" in outcome):
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
_TRIAL_DOCUMENT: dict[str, Any] = {
    "principal": {"key_id": "key_trial", "agent": "", "scopes": [], "tenant": "ten_trial"},
    "tool": {
        "name": "trial",
        "version": "1.0.0",
        "scopes_required": [],
        "requires_approval": False,
        "risk_class": "low",
        "action_class": "read",
        "network": "none",
        "idempotent": True,
        "endpoint_type": "builtin",
        "cost": {"amount": "0", "currency": "EUR"},
    },
    "request": {"run_id": None, "step_index": None, "input_digest": "hmac-sha256:" + "0" * 64},
    "context": {"request_id": "req_trial", "time": "2026-01-01T00:00:00+00:00"},
}


def _compile(modules: list[tuple[str, str]]) -> Any:
    interpreter = Interpreter()
    try:
        for name, source in modules:
            interpreter.add_module(name, source)
        bundle = interpreter.build(None, [ENTRYPOINT])
    except Exception as exc:  # regopy raises RegoError and, for some input, others
        raise PolicyError(f"policy does not compile: {str(exc)[:300]}") from exc
    # `ok` is a method: a bundle that failed to build must never be queried (rego-cpp
    # crashes the process on it).
    if not bundle.ok():
        raise PolicyError("policy does not compile")
    return bundle


def _query(interpreter: Interpreter, bundle: Any, document: dict[str, Any]) -> PolicyResult:
    try:
        interpreter.set_input(Input(document))
        output = interpreter.query_bundle_entrypoint(bundle, ENTRYPOINT)
        raw = json.loads(str(output))["expressions"][0]
    except Exception as exc:
        raise PolicyError(f"policy evaluation failed: {str(exc)[:300]}") from exc
    if not isinstance(raw, dict):
        raise PolicyError("policy evaluation failed: the decision is not an object")
    return _result(raw)


def compiled_policy(tenant_modules: list[tuple[str, str]]) -> CompiledPolicy:
    """The compiled bundle for the default module plus `tenant_modules` (cached)."""
    modules = [("eai_tool.rego", _default_source), *tenant_modules]
    version = policy_version(modules)
    policy = _compiled.get(version)
    if policy is None:
        with _compile_lock:
            policy = _compiled.get(version)
            if policy is None:
                policy = CompiledPolicy(version=version, bundle=_compile(modules))
                _compiled[version] = policy
    return policy


def _interpreter() -> Interpreter:
    interpreter = getattr(_local, "interpreter", None)
    if interpreter is None:
        interpreter = _local.interpreter = Interpreter()
    return interpreter


def evaluate(
    document: dict[str, Any], tenant_modules: list[tuple[str, str]]
) -> tuple[PolicyResult, str]:
    """Decide `tool.invoke` for `document`; returns the result and the policy version."""
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
    policy = compiled_policy(tenant_modules)
    combined = _query(_interpreter(), policy.bundle, document)
    added = [o for o in combined.obligations if o not in base.obligations]
    result = PolicyResult(
        allow=base.allow and combined.allow,
        reasons=sorted(set(base.reasons) | set(combined.reasons)),
        obligations=sorted([*base.obligations, *added], key=json.dumps),
        missing_scopes=base.missing_scopes,
    )
    return result, policy.version


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
