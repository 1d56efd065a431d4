"""The apply-time trial of a tenant's policy module, run in a process of its own.

`gateway.policy.check_module` starts `python -m gateway.policy_trial`, writes the
modules and the trial document to it as JSON, and watches it: past its time or memory
bound the process is killed and the module refused. Evaluated in the server's process,
one module (`some i in numbers.range(1, 100000000)`) grew the process to 24 GB until the
kernel killed it, with every call it was serving. (rego-cpp's allocator cannot start
under an address-space or data rlimit, hence the watch from outside.) It prints
`{"decision": {...}}` or `{"error": "..."}`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

from regopy import Interpreter

from gateway.policy import PolicyError, _compile, _query


def main() -> None:
    # Ended by the kernel, whatever the watching process does (it may die first): the
    # alarm's default action stops this process even inside rego-cpp's own code.
    bound = float(os.environ.get("EAI_TRIAL_SECONDS", "10"))
    signal.alarm(int(bound) + 5)
    resource.setrlimit(resource.RLIMIT_CPU, (int(bound) + 5, int(bound) + 6))
    request = json.load(sys.stdin)
    # rego-cpp writes its compile errors to standard output: the answer gets the real
    # one to itself, and what the library prints goes where standard error goes.
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        bundle = _compile([(name, source) for name, source in request["modules"]])
        result = _query(Interpreter(), bundle, request["document"])
    except PolicyError as exc:
        json.dump({"error": str(exc)}, answer)
    else:
        decision = {"allow": result.allow, "missing_scopes": result.missing_scopes}
        json.dump({"decision": decision}, answer)
    answer.close()


if __name__ == "__main__":
    main()
