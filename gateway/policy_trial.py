"""The apply-time trial of a tenant's policy module, run in a process of its own.

`gateway.policy.check_module` starts `python -m gateway.policy_trial`, writes the
modules and the trial documents to it as JSON, and watches it: past its time or memory
bound the process is killed and the module refused. Evaluated in the server's process,
one module (`some i in numbers.range(1, 100000000)`) grew the process to 24 GB until the
kernel killed it, with every call it was serving. Each decision is also held to the
invoke budget as `gateway.policy_worker` holds it (a CPU timer whose signal ends the
process; an address-space limit set once rego-cpp's allocator has started, since it
cannot start under one). It prints `{"decisions": [...]}` or `{"error": "..."}`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

from regopy import Interpreter

from gateway.policy_worker import PYTHON_SLACK, drop_standard_output, vm_bytes
from gateway.rego import DEFAULT_POLICY, PolicyError, compile_bundle, query_decision


def main() -> None:
    # Ended by the kernel, whatever the watching process does (it may die first): the
    # alarm's default action stops this process even inside rego-cpp's own code.
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # whatever the server inherited
    bound = float(os.environ.get("EAI_TRIAL_SECONDS", "10"))
    signal.alarm(int(bound) + 5)
    resource.setrlimit(resource.RLIMIT_CPU, (int(bound) + 5, int(bound) + 6))
    cpu = float(os.environ.get("EAI_TRIAL_CPU_S", "0.25"))
    memory = int(os.environ.get("EAI_TRIAL_MEMORY", str(256 << 20)))
    request = json.load(sys.stdin)
    # rego-cpp writes its compile errors, and a module's `print` output, to standard
    # output: the answer gets the real one to itself, and what the library prints is
    # dropped.
    answer = os.fdopen(os.dup(1), "w")
    drop_standard_output()
    interpreter = Interpreter()
    warm_up = {"principal": {"scopes": []}, "tool": {}}
    query_decision(
        interpreter, compile_bundle([("eai_tool.rego", DEFAULT_POLICY.read_text())]), warm_up
    )
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + memory + PYTHON_SLACK, -1))
    decisions = []
    try:
        # Past the budget, SIGPROF ends the process (the watcher reads that signal).
        signal.setitimer(signal.ITIMER_PROF, cpu)
        bundle = compile_bundle([(name, source) for name, source in request["modules"]])
        for document in request["documents"]:
            signal.setitimer(signal.ITIMER_PROF, cpu)
            raw = query_decision(interpreter, bundle, document)
            missing = raw.get("missing_scopes")
            missing = [str(scope) for scope in missing] if isinstance(missing, list) else []
            decisions.append({"allow": raw.get("allow") is True, "missing_scopes": missing})
        signal.setitimer(signal.ITIMER_PROF, 0)
    except PolicyError as exc:
        json.dump({"error": str(exc)}, answer)
    else:
        json.dump({"decisions": decisions}, answer)
    answer.close()


if __name__ == "__main__":
    main()
