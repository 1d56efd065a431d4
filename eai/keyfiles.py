"""Keys generated once into git-ignored files that every process of the checkout reads
(the embedded default's secret key and audit signing key)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    """The key in `path`, else a new one from `make()`, written there once.

    The file appears whole or not at all: the key is written to a temporary file beside
    it, then linked to `path`, which fails if another process linked its own first (its
    key is then read and used). Creating `path` itself then writing it let a second
    process starting in between read it empty, and run with an empty key."""
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
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
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process won the race, or left an empty file
            existing = path.read_text().strip()
            if existing:
                return existing
            os.replace(tmp, path)  # an empty file from an older writer: ours replaces it
            tmp = ""
    finally:
        if tmp:
            os.unlink(tmp)
    return key
