"""Request body parsers: strict JSON (depth-bounded) and YAML for manifests."""

from __future__ import annotations

import json
import math
from typing import Any

import yaml
from django.conf import settings
from django.utils.translation import gettext_lazy as _
from rest_framework.parsers import BaseParser

from eai.errors import ApiError, Text


class JSONInvalid(ValueError):
    """Why a body is not acceptable JSON, as a translatable fragment."""

    def __init__(self, reason: Text) -> None:
        self.reason = reason
        super().__init__(str(reason))


def _too_deep() -> JSONInvalid:
    return JSONInvalid(
        Text(_("nested deeper than %(limit)s levels"), limit=settings.EAI_MAX_JSON_DEPTH)
    )


def _reject_constant(name: str) -> Any:
    raise JSONInvalid(Text(_("%(name)s is not valid JSON"), name=name))


def finite_float(text: str) -> float:
    """`parse_float` that refuses numbers beyond a double (1e400 reads as infinity, which
    JSON cannot write back: the call would go upstream as `Infinity`, then fail to store)."""
    value = float(text)
    if value in (math.inf, -math.inf):
        # Quoted with its digits masked as text's are (4111111111111111e400 is a card):
        # the detectors do not read digits glued to the exponent's letter.
        from gateway.dlp import scrub_text

        mantissa, e, exponent = text[:40].replace("E", "e").partition("e")
        shown = scrub_text(mantissa)[0] + e + exponent
        raise JSONInvalid(Text(_("the number %(number)s is too large"), number=shown))
    return value


def text_problem(value: Any, raw: bytes | str) -> Text | None:
    """Why the strings of a parsed document cannot be stored or sent on, else None:
    U+0000 (PostgreSQL's jsonb cannot hold it) or a lone surrogate escape (`"\\ud800"`,
    which no UTF-8 encoder can write). The walk runs only when `raw` holds such an
    escape, so the common path pays two substring tests."""
    if isinstance(raw, bytes):
        nul, surrogate = b"u0000" in raw, b"\\ud" in raw or b"\\uD" in raw
    else:
        nul, surrogate = "u0000" in raw, "\\ud" in raw or "\\uD" in raw
    if not (nul or surrogate):
        return None
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if nul and "\x00" in node:
                return Text(_("the NUL character (\\u0000) is not accepted"))
            if surrogate:
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return Text(_("a string holds a lone surrogate (\\ud800-\\udfff)"))
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """True when `value` nests containers deeper than `limit` levels (iterative)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def loads_strict(data: bytes | str) -> Any:
    """json.loads that refuses NaN/Infinity and nesting deeper than EAI_MAX_JSON_DEPTH.

    The C decoder guards its own recursion (RecursionError past ~1000 levels), so a
    hostile `[[[[…` fails fast; the iterative walk then enforces our lower limit.
    """
    try:
        if isinstance(data, bytes):
            # UTF-8 and nothing else (RFC 8259), strictly: json.loads would guess UTF-16
            # or UTF-32 from the bytes, and read UTF-8-encoded surrogates ("\xed\xa0\x80")
            # as a lone U+D800 that no later write can encode (a run's goal holding one
            # broke every page of the tenant's event feed).
            data = data.decode("utf-8")
        value = json.loads(data, parse_constant=_reject_constant, parse_float=finite_float)
    except RecursionError as exc:
        raise _too_deep() from exc
    except UnicodeDecodeError as exc:
        raise JSONInvalid(Text(_("the body is not UTF-8"))) from exc
    except json.JSONDecodeError as exc:
        raise JSONInvalid(
            Text(
                _("syntax error at line %(line)s, column %(column)s"),
                line=exc.lineno,
                column=exc.colno,
            )
        ) from exc
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        if isinstance(exc, JSONInvalid):
            raise
        raise JSONInvalid(Text(_("a number has too many digits"))) from exc
    if json_depth_exceeds(value, settings.EAI_MAX_JSON_DEPTH):
        raise _too_deep()
    # Refused here, clearly, rather than failing later at storage or upstream.
    problem = text_problem(value, data)
    if problem is not None:
        raise JSONInvalid(problem)
    return value


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        raw = stream.read() if stream is not None else b""
        if not raw.strip():
            raise ApiError("invalid_json", reason=Text(_("the body is empty")))
        try:
            return loads_strict(raw)
        except JSONInvalid as exc:
            raise ApiError("invalid_json", reason=exc.reason) from exc


class _AliasRefused(yaml.MarkedYAMLError):
    pass


class _NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases (`*name`): nine nested lists of nine aliases
    each ("billion laughs") are 359 bytes that expand to 9^10 nodes. A manifest has no
    need of them; anchors alone are harmless and stay allowed."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(problem="alias", problem_mark=event.start_mark)
        return super().compose_node(parent, index)


def load_yaml_documents(text: str) -> list[Any]:
    """Every non-empty document of a YAML text, aliases refused (see `_NoAliasLoader`)."""
    loader = _NoAliasLoader(text)
    docs = []
    try:
        while loader.check_data():
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
    finally:
        loader.dispose()
    return docs


class YAMLParser(BaseParser):
    """YAML bodies (manifests). Safe loader only; several documents become a list."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        raw = stream.read() if stream is not None else b""
        try:
            docs = load_yaml_documents(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ApiError("invalid_json", reason=Text(_("the body is not UTF-8"))) from exc
        except _AliasRefused as exc:
            mark = exc.problem_mark
            raise ApiError(
                "invalid_json",
                reason=Text(
                    _("YAML aliases (*name) are not accepted (line %(line)s, column %(column)s)"),
                    line=mark.line + 1,
                    column=mark.column + 1,
                ),
            ) from exc
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise ApiError(
                "invalid_json",
                reason=Text(
                    _("YAML syntax error at line %(line)s, column %(column)s"),
                    line=mark.line + 1 if mark else "?",
                    column=mark.column + 1 if mark else "?",
                ),
            ) from exc
        except RecursionError as exc:
            raise ApiError("invalid_json", reason=_too_deep().reason) from exc
        except ValueError as exc:  # a 5,000-digit integer, a date like 2026-13-45
            reason = (
                Text(_("a number has too many digits"))
                if "digits" in str(exc)
                else Text(_("the YAML holds values JSON cannot represent"))
            )
            raise ApiError("invalid_json", reason=reason) from exc
        if not docs:
            raise ApiError("invalid_json", reason=Text(_("the body is empty")))
        if json_depth_exceeds(docs, settings.EAI_MAX_JSON_DEPTH):
            raise ApiError("invalid_json", reason=_too_deep().reason)
        try:
            # Manifests are JSON documents: YAML-only values (dates, sets, .inf) are
            # refused, and the strings pass the JSON body's own checks.
            return loads_strict(json.dumps(docs[0] if len(docs) == 1 else docs))
        except JSONInvalid as exc:
            raise ApiError("invalid_json", reason=exc.reason) from exc
        except (TypeError, ValueError) as exc:
            raise ApiError(
                "invalid_json", reason=Text(_("the YAML holds values JSON cannot represent"))
            ) from exc


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"


class TextXYAMLParser(YAMLParser):
    media_type = "text/x-yaml"
