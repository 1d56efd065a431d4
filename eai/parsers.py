"""Request body parsers: strict JSON (depth-bounded) and YAML for manifests."""

from __future__ import annotations

import json
from typing import Any

import yaml
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


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
        raise ValueError(f"nested deeper than {settings.EAI_MAX_JSON_DEPTH} levels") from exc
    if json_depth_exceeds(value, settings.EAI_MAX_JSON_DEPTH):
        raise ValueError(f"nested deeper than {settings.EAI_MAX_JSON_DEPTH} levels")
    return value


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        raw = stream.read() if stream is not None else b""
        if not raw.strip():
            raise ParseError("empty body")
        try:
            return loads_strict(raw)
        except UnicodeDecodeError as exc:
            raise ParseError("body is not UTF-8") from exc
        except (ValueError, RecursionError) as exc:
            raise ParseError(str(exc)[:200]) from exc


class YAMLParser(BaseParser):
    """YAML bodies (manifests). Safe loader only; several documents become a list."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        raw = stream.read() if stream is not None else b""
        try:
            docs = [doc for doc in yaml.safe_load_all(raw.decode("utf-8")) if doc is not None]
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ParseError(f"invalid YAML: {str(exc)[:200]}") from exc
        if not docs:
            raise ParseError("empty body")
        if json_depth_exceeds(docs, settings.EAI_MAX_JSON_DEPTH):
            raise ParseError(f"nested deeper than {settings.EAI_MAX_JSON_DEPTH} levels")
        return docs[0] if len(docs) == 1 else docs


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"
