"""Ids: `<prefix>_` + 26 Crockford base32 digits, the creation millisecond then 80
random bits, so that ordering by id is ordering by creation."""

from __future__ import annotations

import time
from unittest import mock

from gateway.models import new_id

CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def decode(identifier: str) -> tuple[str, int, int]:
    prefix, _, digits = identifier.partition("_")
    assert len(digits) == 26 and set(digits) <= set(CROCKFORD), identifier
    value = 0
    for digit in digits:
        value = value << 5 | CROCKFORD.index(digit)
    return prefix, value >> 80, value & (2**80 - 1)


def test_an_id_carries_its_millisecond_and_80_random_bits() -> None:
    before = int(time.time() * 1000)
    identifier = new_id("tinv")
    after = int(time.time() * 1000)
    prefix, millisecond, random_bits = decode(identifier)
    assert prefix == "tinv"
    assert before <= millisecond <= after
    assert 0 <= random_bits < 2**80


def test_an_id_spells_known_inputs_exactly() -> None:
    """Known time and random bytes, spelled by hand: 1000 ms = 31 × 32 + 8."""
    with (
        mock.patch("gateway.models.time.time", return_value=1.0),
        mock.patch("gateway.models.os.urandom", return_value=bytes(9) + b"\x01"),
    ):
        assert new_id("dec") == "dec_00000000z8" + "0" * 15 + "1"
    with (
        mock.patch("gateway.models.time.time", return_value=(2**48 - 1) / 1000),
        mock.patch("gateway.models.os.urandom", return_value=b"\xff" * 10),
    ):
        assert new_id("x") == "x_" + "7" + "z" * 9 + "z" * 16


def test_ids_are_distinct_and_ordered_by_time() -> None:
    first = [new_id("evt") for _ in range(2000)]
    assert len(set(first)) == 2000
    assert len({decode(i)[2] for i in first}) == 2000  # the random part alone differs
    time.sleep(0.002)
    later = new_id("evt")
    assert all(earlier < later for earlier in first)
    # Random bits spread over all 80: across 2000 ids every bit position is seen set.
    seen = 0
    for identifier in first:
        seen |= decode(identifier)[2]
    assert seen == 2**80 - 1
