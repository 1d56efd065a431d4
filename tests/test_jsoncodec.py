"""eai.jsoncodec: orjson's bytes where a reader parses them, `json`'s where orjson refuses."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from eai.jsoncodec import answer_json, transport_json


def _json_answer(value: object) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()


@dataclasses.dataclass
class _Point:
    x: int


NO_FLOATS = [
    {"b": 1, "a": [True, None, "é€😀", '\u2028\x1f"\\/'], "é": {}, "Z": -(2**63)},
    {"\ue000": 1, "😀": 2, "\ud7ff": 3, "": [[], {}]},
    [2**63 - 1, "x" * 300, {"nested": {"deep": ["list", 0]}}],
    {"when": datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC), "day": date(2026, 1, 2)},
    {"id": uuid.UUID(int=7), "amount": Decimal("0.001"), "point": _Point(1)},
]


@pytest.mark.parametrize("value", NO_FLOATS)
def test_answer_bytes_are_the_json_module_bytes(value: object) -> None:
    assert answer_json(value) == _json_answer(value)


@pytest.mark.parametrize(
    "value",
    [{"big": 2**64}, {"neg": -(2**70)}, {1: "a", 10: "b", 9: "c"}],
)
def test_what_orjson_refuses_is_written_by_json(value: object) -> None:
    assert answer_json(value) == _json_answer(value)
    assert json.loads(transport_json(value)) == json.loads(json.dumps(value, default=str))


@pytest.mark.parametrize("number", [1e-7, 3.7e-05, 0.1, 1e16, 1.5e300, -0.0, 123456.789])
def test_floats_keep_their_value(number: float) -> None:
    assert json.loads(answer_json({"n": number}))["n"] == number
    assert json.loads(transport_json({"n": number}))["n"] == number


@pytest.mark.parametrize("value", [*NO_FLOATS, {"f": [0.5, 1e-9]}])
def test_transport_reads_back_as_json_wrote_it(value: object) -> None:
    assert json.loads(transport_json(value)) == json.loads(json.dumps(value, default=str))


def test_a_lone_surrogate_still_fails_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        _json_answer({"s": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        answer_json({"s": "\ud800"})
