"""eai.keyfiles: a key file appears whole, once, whatever processes race to make it."""

from __future__ import annotations

import multiprocessing
import secrets

from eai.keyfiles import read_or_create


def _make_key(path: str, start, out) -> None:
    from pathlib import Path

    start.wait()
    out.put(read_or_create(Path(path), lambda: secrets.token_urlsafe(50)))


def test_racing_processes_all_use_the_one_key(tmp_path):
    path = tmp_path / ".key"
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_make_key, args=(str(path), start, out)) for _ in range(8)]
    for proc in procs:
        proc.start()
    start.set()
    keys = {out.get(timeout=60) for _ in procs}
    for proc in procs:
        proc.join(timeout=60)
    assert len(keys) == 1 and "" not in keys
    assert keys == {path.read_text()}
    # No temporary left; the lock file stays beside the key.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".key", ".key.lock"]


def test_an_empty_file_left_by_an_older_writer_is_replaced(tmp_path):
    path = tmp_path / ".key"
    path.write_text("")
    key = read_or_create(path, lambda: "k" * 20)
    assert key == "k" * 20 and path.read_text() == key
    assert read_or_create(path, lambda: "other") == key
