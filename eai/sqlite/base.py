"""Django's SQLite backend, with the embedded default's writers queued in the process.

SQLite admits one writer at a time. Every transaction here begins IMMEDIATE (it takes
the write lock at BEGIN), and a writer that finds the lock taken is made to wait by
SQLite's busy handler, which sleeps and retries with growing pauses (up to 100 ms
each): under 16 concurrent calls in `make run`, that gave a p99 over a second while the
median call took 16 ms. Queuing the writers of this process on a lock instead hands the
database over the moment it is free. Other processes (a management command) still meet
SQLite's own lock and its busy timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db.backends.sqlite3 import base

_WRITER = threading.Lock()
# Past this wait, fall back to SQLite's own lock and busy timeout rather than hang (a
# test holding a transaction open while a server thread of the same process writes).
WAIT_S = 30.0


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False

    def _start_transaction_under_autocommit(self) -> None:
        self._holds_writer = _WRITER.acquire(timeout=WAIT_S)
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        if self._holds_writer:
            self._holds_writer = False
            _WRITER.release()

    def _then_release(self, step: Callable[[], None]) -> None:
        try:
            step()
        finally:
            self._release_writer()

    # Each way a transaction ends gives the queue back.
    def _commit(self) -> None:
        self._then_release(super()._commit)

    def _rollback(self) -> None:
        self._then_release(super()._rollback)

    def _close(self) -> None:
        self._then_release(super()._close)
