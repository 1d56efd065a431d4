"""A feed event's payload stays within 8 KiB: its largest values give way to a marker,
largest first, so that what a reader needs (tool, status, step, cost) stays."""

import json

from gateway.audit import MAX_EVENT_PAYLOAD_BYTES, _bounded


def size(value) -> int:
    return len(json.dumps(value, default=str))


def test_it_leaves_a_small_payload_as_it_is():
    payload = {"tool": "t", "status": "succeeded", "input": "x" * 100}
    assert _bounded(payload) is payload


def test_a_payload_of_exactly_the_limit_is_left_as_it_is():
    payload = {"tool": "t", "input": ""}
    payload["input"] = "x" * (MAX_EVENT_PAYLOAD_BYTES - size(payload))
    assert size(payload) == MAX_EVENT_PAYLOAD_BYTES
    assert _bounded(payload) is payload


def test_it_replaces_the_largest_values_first_and_keeps_the_rest():
    # Alphabetical order and size order disagree: the largest goes first, whatever its name.
    payload = {"tool": "t", "zeta": "z" * 5000, "alpha": "a" * 7000, "step": 2}
    bounded = _bounded(payload)
    assert bounded == {
        "tool": "t",
        "zeta": "z" * 5000,
        "alpha": {"truncated": True, "size_bytes": 7002},
        "step": 2,
        "truncated": True,
    }
    assert size(bounded) <= MAX_EVENT_PAYLOAD_BYTES
    assert payload["alpha"] == "a" * 7000  # the caller's payload is left as it was


def test_it_replaces_as_many_as_it_takes():
    payload = {"a": "a" * 6000, "b": "b" * 5000, "c": "c" * 4000, "tool": "t"}
    bounded = _bounded(payload)
    assert bounded["a"] == {"truncated": True, "size_bytes": 6002}
    assert bounded["b"] == {"truncated": True, "size_bytes": 5002}
    assert bounded["c"] == "c" * 4000 and bounded["tool"] == "t"
    assert bounded["truncated"] is True


def test_many_small_values_give_the_marker_alone():
    payload = {f"k{n}": "v" * 60 for n in range(200)}
    assert _bounded(payload) == {"truncated": True, "size_bytes": size(payload)}


def test_a_payloads_own_truncated_key_is_kept_and_the_limit_is_exact():
    """Without a marker to add, the limit is the whole 8 KiB: a payload that fits it
    exactly once its largest value gave way keeps everything else."""
    base = {"truncated": "own", "big": "x" * 20000, "pad": ""}
    replaced = {**base, "big": {"truncated": True, "size_bytes": 20002}}
    pad = MAX_EVENT_PAYLOAD_BYTES - size(replaced)
    payload = {**base, "pad": "y" * pad}
    bounded = _bounded(payload)
    assert bounded == {**replaced, "pad": "y" * pad}
    assert size(bounded) == MAX_EVENT_PAYLOAD_BYTES


def test_with_a_marker_to_add_the_limit_leaves_room_for_it():
    base = {"big": "x" * 20000, "pad": ""}
    replaced = {**base, "big": {"truncated": True, "size_bytes": 20002}}
    pad = MAX_EVENT_PAYLOAD_BYTES - size(replaced)  # fits without the marker, not with it
    bounded = _bounded({**base, "pad": "y" * pad})
    assert bounded["pad"] == {"truncated": True, "size_bytes": pad + 2}
    assert bounded["truncated"] is True
    assert size(bounded) <= MAX_EVENT_PAYLOAD_BYTES
