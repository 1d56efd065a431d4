"""Fast JSON encoding for bytes that are read, not compared: answers and the call's
document for PostgreSQL.

`json.dumps` took 20-60 µs a call for the documents the invoke path writes; orjson takes
a tenth of that. orjson spells some floats differently (`0.00001` where `json` writes
`1e-05`): the same number to any JSON reader, other bytes. So digests that are stored
and compared later (an approval's input, an Idempotency-Key's request) keep `json`'s
canonical form (`canonical_json`); only what a reader parses comes from orjson. orjson
refuses integers beyond 64 bits and keys that are not strings: `json` then writes those
documents, as before.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# Dates and dataclasses go to `default=str`, as with `json`, not orjson's own spelling.
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_SORTED = _OPTIONS | orjson.OPT_SORT_KEYS


def canonical_json(value: Any) -> bytes:
    """Keys sorted, no spaces, UTF-8, `str()` for anything else: the bytes digests hash."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()


def answer_json(value: Any) -> bytes:
    """An answer's body: `canonical_json` as orjson spells it."""
    try:
        return orjson.dumps(value, default=str, option=_SORTED)
    except TypeError:  # orjson.JSONEncodeError is one
        return canonical_json(value)


def transport_json(value: Any) -> str:
    """JSON text of `value` for PostgreSQL's jsonb (`str()` for anything else)."""
    try:
        return orjson.dumps(value, default=str, option=_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, default=str)
