"""The published JSON Schemas (`contracts/v1/*.schema.json`), compiled once."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache, lru_cache
from typing import Any

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema_specifications import REGISTRY as SPECIFICATIONS

from eai.errors import Text

CONTRACTS_DIR = settings.BASE_DIR / "contracts" / "v1"


@lru_cache(maxsize=4096)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """`pattern` compiled for Python with ECMA-262's meaning of `$`, as JSON Schema
    specifies: the end of the string. Python's `$` also matches before a final newline,
    so "1.0.0\\n" passed "^[0-9.]+$". A bare `$` (not escaped, not in a class, as
    Python reads classes: a `]` first in one is a character) becomes `\\Z`. Raises
    re.error for a pattern Python cannot compile."""
    out: list[str] = []
    escaped = in_class = False
    class_size = 0  # characters in the open class so far (a leading `^` not counted)
    for char in pattern:
        if escaped:
            escaped = False
            class_size += in_class
        elif char == "\\":
            escaped = True
        elif in_class:
            if char == "]" and class_size > 0:
                in_class = False
            elif not (char == "^" and class_size == 0 and out[-1] == "["):
                class_size += 1
        elif char == "[":
            in_class, class_size = True, 0
        elif char == "$":
            char = "\\Z"
        out.append(char)
    return re.compile("".join(out))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        regex = ecma_regex(pattern)
    except re.error:  # refused at apply (manifests); a schema stored before still answers
        yield ValidationError(f"the schema's pattern {pattern!r} cannot be used")
        return
    if not regex.search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# Draft 2020-12 with ECMA-262 `pattern`s: the published contracts and every tool schema.
Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def contract_names() -> list[str]:
    return sorted(p.name.removesuffix(".schema.json") for p in CONTRACTS_DIR.glob("*.schema.json"))


@cache
def load_contract(name: str) -> dict[str, Any] | None:
    if name not in contract_names():
        return None
    return json.loads((CONTRACTS_DIR / f"{name}.schema.json").read_text())


@cache
def contract_validator(name: str) -> Draft202012Validator | None:
    schema = load_contract(name)
    if schema is None:
        return None
    return Validator(schema, format_checker=Validator.FORMAT_CHECKER, registry=SPECIFICATIONS)


def json_pointer(path: Any) -> str:
    """RFC 6901 pointer for a jsonschema error path."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else ""


def _leaf_errors(error: ValidationError) -> list[ValidationError]:
    """The most specific errors: an if/then or allOf failure is reported by its causes."""
    if error.context:
        leaves: list[ValidationError] = []
        for sub in error.context:
            leaves.extend(_leaf_errors(sub))
        return leaves
    return [error]


def _value_free(leaf: ValidationError) -> tuple[Any, tuple[tuple[str, str], ...]]:
    """A violation said from the schema's side only, as a translatable (template,
    params): what the document holds is never quoted (jsonschema's own messages quote
    it, with Python's repr)."""
    kind, expected = leaf.validator, leaf.validator_value
    if kind is None:  # a `false` subschema
        return _("is not allowed by the schema"), ()
    if kind == "required":  # the missing name comes from the schema
        name = leaf.message.rsplit(" is a required property", 1)[0]
        return _("lacks the required property %(name)s"), (("name", name[:200]),)
    if kind == "type":
        return _("is not of type %(type)s"), (("type", json.dumps(expected)),)
    if kind in ("additionalProperties", "unevaluatedProperties", "propertyNames"):
        return _("has properties the schema does not allow"), ()
    if kind in ("enum", "const"):
        return _("is not an allowed value"), ()
    rule = json.dumps(expected, default=str)[:80]
    return _("does not satisfy %(keyword)s %(rule)s"), (("keyword", str(kind)), ("rule", rule))


def _violations(
    validator: Draft202012Validator, document: Any, describe: Any
) -> dict[tuple[str, str], None]:
    """Each distinct (JSON pointer, `describe(leaf)`), in the validator's order."""
    return dict.fromkeys(
        (json_pointer(leaf.absolute_path), describe(leaf))
        for error in validator.iter_errors(document)
        for leaf in _leaf_errors(error)
    )


def value_free_errors(validator: Draft202012Validator, document: Any) -> list[dict[str, Any]]:
    """As `schema_errors`, without any value of `document` in the messages: for answers
    from a tool, which may hold a credential or personal data in any field. Messages
    are `Text`s, rendered in the language of the answer they go into."""
    with translation.override(None):  # ordered by the templates, whatever the language
        found = sorted(
            _violations(validator, document, _value_free),
            key=lambda v: (v[0], str(v[1][0]), v[1][1]),
        )
    return [
        {"path": path, "message": Text(template, **dict(params))}
        for path, (template, params) in found
    ]


def schema_errors(validator: Draft202012Validator, document: Any) -> list[dict[str, str]]:
    """Every violation as `{"path": <JSON pointer>, "message": …}`, in document order."""
    found = _violations(validator, document, lambda leaf: leaf.message[:500])
    return sorted(
        ({"path": path, "message": message} for path, message in found),
        key=lambda e: e["path"],
    )
