"""The tenant scope: the one place a transaction is bound to a tenant.

Every request, task, admin view and command that touches tenant data enters
`tenant_scope(tenant)`. On PostgreSQL it sets `app.tenant_id` for the transaction
(`set_config(..., true)`, so it dies with the transaction and never leaks to the next
user of a pooled connection); row-level security policies read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from django.db import connection, transaction

from tenants.models import Tenant


@contextmanager
def tenant_scope(tenant: Tenant, *, readonly: bool = False) -> Iterator[None]:
    """A transaction in which only `tenant`'s rows are visible (enforced on PostgreSQL).

    `readonly` scopes on SQLite open no transaction: there every transaction takes the
    write lock at BEGIN (IMMEDIATE mode), and readers must not queue behind writers.
    SQLite has no row-level security, so the scope there is the ORM filter alone.
    """
    if connection.vendor != "postgresql":
        with nullcontext() if readonly else transaction.atomic():
            yield
        return
    if not connection.in_atomic_block:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant.id)])
            yield
        return
    # Inside an enclosing transaction a transaction-local setting outlives this block:
    # put the enclosing one back on the way out, so that code after the block sees the
    # tenant it had (or none), never this one's rows. (On an error the savepoint's
    # rollback undoes the setting.)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('app.tenant_id', true),"
                " set_config('app.tenant_id', %s, true)",
                [str(tenant.id)],
            )
            previous = cursor.fetchone()[0] or ""
        yield
        if not connection.needs_rollback:  # else the savepoint's rollback undoes it
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [previous])
