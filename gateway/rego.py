"""rego-cpp (regopy) as the gateway runs it: modules built into a bundle with the
`eai/tool/decision` entrypoint, and that entrypoint queried for a document.

Nothing here needs Django: the evaluator and trial processes import this alone, so a
new evaluator starts in a fraction of the time the whole gateway takes to import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regopy import Input, Interpreter

DEFAULT_POLICY = Path(__file__).with_name("policies") / "eai_tool.rego"
ENTRYPOINT = "eai/tool/decision"


class PolicyError(Exception):
    """The policy could not be compiled or evaluated; the gateway fails closed (deny)."""


def compile_bundle(modules: list[tuple[str, str]]) -> Any:
    """`modules` (name, source) built into a bundle with the decision's entrypoint."""
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


def query_decision(
    interpreter: Interpreter, bundle: Any, document: dict[str, Any]
) -> dict[str, Any]:
    """The decision object as the bundle's entrypoint gives it (MemoryError passes)."""
    try:
        interpreter.set_input(Input(document))
        output = interpreter.query_bundle_entrypoint(bundle, ENTRYPOINT)
        raw = json.loads(str(output))["expressions"][0]
    except MemoryError:
        raise
    except json.JSONDecodeError as exc:
        # rego-cpp answers an allocation that failed (under an evaluator's address-space
        # limit) with an error document regopy cannot read as JSON.
        if "std::bad_alloc" in exc.doc:
            raise MemoryError("rego-cpp: std::bad_alloc") from exc
        raise PolicyError(f"policy evaluation failed: {str(exc)[:300]}") from exc
    except Exception as exc:
        raise PolicyError(f"policy evaluation failed: {str(exc)[:300]}") from exc
    if not isinstance(raw, dict):
        raise PolicyError("policy evaluation failed: the decision is not an object")
    return raw
