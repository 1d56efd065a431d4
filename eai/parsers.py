"""Request body parsers: strict JSON (depth-bounded) and YAML for manifests."""

from __future__ import annotations

import json
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
        value = json.loads(data, parse_constant=_reject_constant)
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
    if json_depth_exceeds(value, settings.EAI_MAX_JSON_DEPTH):
        raise _too_deep()
    # PostgreSQL's jsonb cannot hold U+0000; refuse it here, clearly, rather than fail
    # later at storage. The byte test keeps the walk off the common path.
    if (b"u0000" in data if isinstance(data, bytes) else "u0000" in data) and _has_nul(value):
        raise JSONInvalid(Text(_("the NUL character (\\u0000) is not accepted")))
    return value


def _has_nul(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


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


class YAMLParser(BaseParser):
    """YAML bodies (manifests). Safe loader only; several documents become a list."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        raw = stream.read() if stream is not None else b""
        try:
            docs = [doc for doc in yaml.safe_load_all(raw.decode("utf-8")) if doc is not None]
        except UnicodeDecodeError as exc:
            raise ApiError("invalid_json", reason=Text(_("the body is not UTF-8"))) from exc
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
        if not docs:
            raise ApiError("invalid_json", reason=Text(_("the body is empty")))
        if json_depth_exceeds(docs, settings.EAI_MAX_JSON_DEPTH):
            raise ApiError("invalid_json", reason=_too_deep().reason)
        try:
            # Manifests are JSON documents: YAML-only values (dates, sets) are refused.
            return json.loads(json.dumps(docs[0] if len(docs) == 1 else docs))
        except (TypeError, ValueError) as exc:
            raise ApiError(
                "invalid_json", reason=Text(_("the YAML holds values JSON cannot represent"))
            ) from exc


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"
