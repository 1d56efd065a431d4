"""The tenant scope: the one place code is bound to a tenant.

Every request, task, admin view and command that touches tenant data runs inside a
scope. A scope binds the tenant for the code it runs (`current_tenant()`), which the
default manager of every tenant-owned model reads: it filters by that tenant, and
refuses to run at all without one (`gateway.models.TenantOwned`). On PostgreSQL the
scope also sets `app.tenant_id`, which the row-level security policies read.

Two entries, one binding:
- `tenant_scope(tenant)`: a transaction bound to the tenant (`set_config(..., true)` on
  PostgreSQL, so the setting dies with the transaction and never leaks to the next
  user of a pooled connection). Domain functions and commands use it.
- `tenant_session(tenant)`: a span of work bound to the tenant without a transaction of
  its own: one API request (`TenantAPIView` enters it once, after authentication) or
  one task (the pipeline commits several times a call). On PostgreSQL it sets the
  session's `app.tenant_id` and empties it before the span ends, whatever happens.

A scope of one tenant cannot be entered inside another tenant's: code bound to tenant A
never reaches B's rows, even by calling a function that would enter B's scope.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar

from django.db import Error, connection, transaction

from tenants.models import Tenant

_ACTIVE: ContextVar[Tenant | None] = ContextVar("eai_tenant_scope", default=None)


class TenantScopeError(RuntimeError):
    """Tenant data touched outside a tenant scope, or another tenant's scope entered
    inside one. A programming error: it is never an answer to a client."""


def current_tenant() -> Tenant | None:
    """The tenant of the innermost scope, or None outside any."""
    return _ACTIVE.get()


@contextmanager
def _bound(tenant: Tenant) -> Iterator[None]:
    active = _ACTIVE.get()
    if active is not None and active.pk != tenant.pk:
        raise TenantScopeError(
            f"the scope of tenant {active.slug!r} is active: {tenant.slug!r}'s cannot be "
            "entered inside it"
        )
    token = _ACTIVE.set(tenant)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextmanager
def tenant_scope(tenant: Tenant, *, readonly: bool = False) -> Iterator[None]:
    """A transaction in which only `tenant`'s rows are visible (enforced on PostgreSQL).

    `readonly` scopes on SQLite open no transaction: there every transaction takes the
    write lock at BEGIN (IMMEDIATE mode), and readers must not queue behind writers.
    SQLite has no row-level security, so the scope there is the managers' filter alone.
    """
    with _bound(tenant):
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
        # Inside an enclosing transaction a transaction-local setting outlives this
        # block: put the enclosing one back on the way out, so that code after the block
        # sees the tenant it had (or none), never this one's rows. (On an error the
        # savepoint's rollback undoes the setting.)
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


@contextmanager
def tenant_session(tenant: Tenant, *, database: bool = True) -> Iterator[None]:
    """Bind one API request or task to `tenant`, without a transaction of its own.

    On PostgreSQL the session's `app.tenant_id` is set for the span and emptied on the
    way out; the transactions `tenant_scope` opens inside set their own, local, value
    (the same tenant). Should emptying it fail, the connection is closed rather than
    handed to the next user with this tenant's setting. Needs a connection of its own
    for the span (Django's, one per thread): never behind a pooler that hands a session
    to several clients between transactions (PgBouncer's transaction mode).

    `database=False` binds the code alone, for work that reads and writes only inside
    `tenant_scope` transactions (the invoke pipeline): two statements less a call, and
    a query outside those transactions would see no row at all.
    """
    with _bound(tenant):
        if connection.vendor != "postgresql" or not database:
            yield
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('app.tenant_id', %s, false)", [str(tenant.id)])
        try:
            yield
        finally:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('app.tenant_id', '', false)")
            except Error:  # any failure: of the statement or of the connection itself
                if not connection.in_atomic_block:
                    connection.close()
                # Inside a failed enclosing transaction (tests) its rollback undoes the
                # session setting made in it.
