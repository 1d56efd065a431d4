"""An evaluator process of `gateway.policy_evaluators`: decides tenant policies, one
request at a time, under the CPU and memory bounds the kernel enforces.

Run as `python -m gateway.policy_worker`; frames in on standard input, out on standard
output (see `gateway.policy_evaluators`).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from collections import OrderedDict
from typing import Any

from regopy import Interpreter

from gateway.policy_evaluators import HEADER, MAX_FRAME
from gateway.rego import DEFAULT_POLICY, PolicyError, compile_bundle, query_decision

# Compiled bundles kept (a tenant's modules change rarely; a version is a digest).
BUNDLES_KEPT = 32
# Python's own allocations on top of the decision budget (the document, the answer).
PYTHON_SLACK = 64 << 20


def main() -> None:
    # Whatever the server did with these signals, here they end the process.
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    # Serving a request matters more than deciding one tenant's module.
    os.nice(5)
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    # rego-cpp writes compile errors, and a module's `print` output, to standard output:
    # the answers get the real one to themselves, and what the library prints is
    # dropped (kept, a module printing in a loop would fill the disk).
    drop_standard_output()
    memory = int(os.environ.get("EAI_POLICY_EVALUATOR_MEMORY", str(256 << 20)))
    interpreter = Interpreter()
    default = [("eai_tool.rego", DEFAULT_POLICY.read_text())]
    # rego-cpp's allocator cannot start under an address-space limit: it starts here,
    # on a first decision, and the limit follows.
    query_decision(interpreter, compile_bundle(default), {"principal": {"scopes": []}, "tool": {}})
    start = vm_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (start + memory + PYTHON_SLACK, resource.RLIM_INFINITY))
    bundles: OrderedDict[str, Any] = OrderedDict()
    while True:
        try:
            request = _read_frame(requests)
        except MemoryError:
            request = {"budget": "memory"}
        if request is None:
            return
        answer: dict[str, Any]
        if "budget" in request:
            answer = {"budget": "memory"}
        else:
            # Past the budget, SIGPROF: its default action ends this process, even
            # inside rego-cpp's own loops.
            signal.setitimer(signal.ITIMER_PROF, max(0.001, float(request["cpu_s"])))
            try:
                answer = _decide(interpreter, bundles, request, default)
            except MemoryError:
                answer = {"budget": "memory"}
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
        # An allocator keeps what it once took: an evaluator that grew by a quarter of
        # the budget makes way for a fresh one rather than fail a later decision.
        if "budget" in answer or vm_bytes() > start + memory // 4:
            answer["retire"] = True
        payload = json.dumps(answer, separators=(",", ":")).encode()
        answers.write(HEADER.pack(len(payload)) + payload)
        answers.flush()
        if answer.get("retire"):
            return


def _decide(
    interpreter: Interpreter,
    bundles: OrderedDict[str, Any],
    request: dict[str, Any],
    default: list[tuple[str, str]],
) -> dict[str, Any]:
    version = request["version"]
    bundle = bundles.get(version)
    if bundle is None:
        if request.get("modules") is None:
            return {"need": True}
        try:
            bundle = compile_bundle(
                [*default, *[(name, source) for name, source in request["modules"]]]
            )
        except PolicyError as exc:
            bundle = exc  # kept too: rego-cpp prints its errors on each compile
        bundles[version] = bundle
        if len(bundles) > BUNDLES_KEPT:
            bundles.popitem(last=False)
    bundles.move_to_end(version)
    if isinstance(bundle, PolicyError):
        return {"error": str(bundle)}
    try:
        return {"decision": query_decision(interpreter, bundle, request["document"])}
    except PolicyError as exc:
        return {"error": str(exc)}


def drop_standard_output() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def vm_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _read_frame(stream: Any) -> dict[str, Any] | None:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        return None
    return json.loads(stream.read(length))


if __name__ == "__main__":
    sys.exit(main())
