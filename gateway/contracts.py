"""The published JSON Schemas (`contracts/v1/*.schema.json`), compiled once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache, lru_cache
from typing import Any

import re2
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema_specifications import REGISTRY as SPECIFICATIONS

from eai.errors import Text

CONTRACTS_DIR = settings.BASE_DIR / "contracts" / "v1"


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is answered, not logged by RE2 itself
_RE2_OPTIONS.never_capture = True  # only whether it matches is asked


@lru_cache(maxsize=4096)
def schema_regex(pattern: str) -> Any:
    """`pattern` (ECMA-262, as JSON Schema reads it) compiled by RE2, or None when RE2
    cannot take it.

    RE2 matches in time linear in the text: a tenant's schema cannot make a call spin
    (`^(a+)+$` against thirty `a` and a `!` held Python's backtracking engine, and with
    it the GIL, for minutes). It takes JSON Schema's recommended subset of ECMA-262 and
    more, not look-arounds or back-references, which apply refuses. Its `$` is already
    ECMA's, the end of the string (Python's also matched before a final newline, so
    "1.0.0\\n" passed "^[0-9.]+$"), its `\\d` and `\\w` are ASCII as in ECMA-262, and
    ECMA's `\\uXXXX` becomes RE2's `\\x{XXXX}`. Where the two read the same text
    differently, ECMA's reading is written out: `.` (no line terminator), `\\s` and
    `\\S` (ECMA's white space, no-break spaces and BOM included), `\\cX`, and letters
    ECMA escapes to themselves (`\\a`, `\\z`, `\\A`: anchors or controls to RE2). A
    surrogate (`\\uD83D`) names half a character, which RE2 cannot match: refused."""
    translated = _ecma_to_re2(pattern)
    if translated is None:
        return None
    try:
        return re2.compile(translated, _RE2_OPTIONS)
    except re2.error:
        return None


# ECMA-262's WhiteSpace and LineTerminator, which `\s` matches (RE2's is [\t\n\f\r ]).
_ECMA_SPACE = (
    "\\t\\n\\x0B\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}\\x{feff}"
)
# Escapes ECMA-262 gives a meaning of their own (others escape the letter itself).
_ECMA_ESCAPES = frozenset("dDwWsSbBfnrtvxupPk")  # \k: a named back-reference (refused)


def _ecma_to_re2(pattern: str) -> str | None:
    out: list[str] = []
    in_class = False
    class_start = -1  # index in `out` of the open class's first member
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escape = pattern[i + 1]
            digits = pattern[i + 2 : i + 6]
            if escape == "u" and len(digits) == 4 and all(c in _HEX for c in digits):
                if 0xD800 <= int(digits, 16) <= 0xDFFF:
                    return None
                out.append(f"\\x{{{digits}}}")
                i += 6
                continue
            if (
                escape == "c"
                and i + 2 < len(pattern)
                and pattern[i + 2].isascii()
                and pattern[i + 2].isalpha()
            ):
                out.append(f"\\x{{{ord(pattern[i + 2]) % 32:02x}}}")
                i += 3
                continue
            if escape == "s":
                out.append(_ECMA_SPACE if in_class else f"[{_ECMA_SPACE}]")
            elif escape == "S" and not in_class:
                out.append(f"[^{_ECMA_SPACE}]")
            elif escape.isascii() and escape.isalpha() and escape not in _ECMA_ESCAPES:
                out.append(escape)  # \a is "a" to ECMA-262
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            # A `]` first in a class is a member (as RE2 and Python read it).
            if char == "]" and len(out) > class_start:
                in_class = False
            out.append(char)
            if char == "^" and len(out) - 1 == class_start:
                class_start += 1  # a leading `^` negates: the members start after it
        elif char == "[":
            in_class = True
            out.append(char)
            class_start = len(out)
        elif char == ".":
            out.append("[^\\n\\r\\x{2028}\\x{2029}]")
        else:
            out.append(char)
        i += 1
    return "".join(out)


_HEX = frozenset("0123456789abcdefABCDEF")


class UnusablePattern(Exception):
    """A schema's pattern RE2 cannot run: refused at apply, but a schema stored by an
    earlier release may hold one (a look-ahead). The schema is at fault, not the
    document: callers answer it as the tool's problem."""


def _unusable(pattern: str) -> ValidationError:
    raise UnusablePattern(pattern)  # the schema's fault: no violation of the document


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    regex = schema_regex(pattern)
    if regex is None:
        yield _unusable(pattern)
    elif not regex.search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's `patternProperties`, with the patterns read as `pattern`s are."""
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = schema_regex(pattern)
        if regex is None:
            yield _unusable(pattern)
            continue
        for name, value in instance.items():
            if regex.search(name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's `additionalProperties`, with `patternProperties` read as above."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    regexes = [schema_regex(p) for p in schema.get("patternProperties", {})]
    extras = [
        name
        for name in instance
        if name not in properties and not any(r is not None and r.search(name) for r in regexes)
    ]
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif not additional and extras:  # jsonschema's messages
        listed = ", ".join(repr(name) for name in sorted(extras))
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{listed} {verb} not match any of the regexes: {patterns}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


# Draft 2020-12 with ECMA-262 patterns run by RE2: the published contracts and every tool
# schema. (`unevaluatedProperties` would still read `patternProperties` with Python's
# engine: apply refuses a schema that has both, see `gateway.manifests`.)
Validator = validators.extend(
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


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


def schema_errors(
    validator: Draft202012Validator, document: Any, bound: int = 500
) -> list[dict[str, str]]:
    """Every violation as `{"path": <JSON pointer>, "message": …}`, in document order."""
    found = _violations(validator, document, lambda leaf: leaf.message[:bound])
    return sorted(
        ({"path": path, "message": message} for path, message in found),
        key=lambda e: e["path"],
    )
