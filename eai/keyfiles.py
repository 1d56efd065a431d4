"""Keys generated once into git-ignored files that every process of the checkout reads
(the embedded default's secret key and audit signing key)."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    """The key in `path`, else a new one from `make()`, written there once.

    Writers take a lock (a file beside it) and look again under it, so one of them
    writes and the others read what it wrote; the key goes to a temporary file that
    then replaces `path`, so a reader without the lock sees no file or the whole key.
    Creating `path` itself then writing it let a second process starting in between
    read it empty, and run with an empty key; an empty file left that way is replaced."""
    existing = _read(path)
    if existing:
        return existing
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existing = _read(path)
        if existing:
            return existing
        key = make()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(key)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return key
