"""PostgreSQL row-level security: the database itself keeps tenants apart.

Every table with a `tenant` column gets `ENABLE` and `FORCE ROW LEVEL SECURITY` and the
policy below, so a connection sees only the rows of the tenant its transaction set in
`app.tenant_id` (tenants/scope.py) and none when it set nothing. Tenants, staff
memberships and API-key digests stay outside: a key is looked up before its tenant is
known. The app connects as a role that is neither superuser, nor BYPASSRLS, nor the
tables' owner (`manage.py setup_postgres` creates it); migrations run as the owner.

Applied after every `migrate` (post_migrate), idempotently, so new tenant tables are
covered without a hand-written migration each.
"""

from __future__ import annotations

from django.apps import apps
from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

TENANT_EXPR = "tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid"
OUTSIDE_POLICY = {"tenants_tenant", "tenants_membership", "tenants_apikey"}
APPEND_ONLY = {"gateway_auditevent", "gateway_auditcheckpoint"}


def tenant_tables(existing: set[str] | None = None) -> list[str]:
    """Tables of models with a `tenant` field (the tenant's own rows); only those in
    `existing` when given (a migration rolled back leaves a model without its table)."""
    tables = []
    for model in apps.get_models():
        if model._meta.db_table in OUTSIDE_POLICY:
            continue
        fields = {f.name for f in model._meta.get_fields()}
        in_db = existing is None or model._meta.db_table in existing
        if "tenant" in fields and model._meta.app_label in ("gateway", "approvals") and in_db:
            tables.append(model._meta.db_table)
    return sorted(tables)


def ensure_schema(connection: BaseDatabaseWrapper) -> None:
    """Create the `eai` schema before the first table is (pre_migrate)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {settings.EAI_DB_SCHEMA}")


def apply_row_level_security(connection: BaseDatabaseWrapper) -> None:
    """Enable, force and (re)create the tenant policy on every tenant table."""
    if connection.vendor != "postgresql":
        return
    app_role = settings.EAI_DB_APP_ROLE
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [app_role])
        has_app_role = cursor.fetchone() is not None
        existing = set(connection.introspection.table_names(cursor))
        for table in tenant_tables(existing):
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"ALTER TABLE {quoted} ENABLE ROW LEVEL SECURITY")
            cursor.execute(f"ALTER TABLE {quoted} FORCE ROW LEVEL SECURITY")
            cursor.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {quoted}")
            cursor.execute(
                f"CREATE POLICY tenant_isolation ON {quoted} "
                f"USING ({TENANT_EXPR}) WITH CHECK ({TENANT_EXPR})"
            )
        if has_app_role:
            role = connection.ops.quote_name(app_role)
            schema = settings.EAI_DB_SCHEMA
            cursor.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            cursor.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
            )
            cursor.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
            for table in APPEND_ONLY:
                cursor.execute(
                    f"REVOKE UPDATE, DELETE, TRUNCATE ON {connection.ops.quote_name(table)} "
                    f"FROM {role}"
                )


def on_pre_migrate(sender, using: str = "default", **kwargs) -> None:
    if sender.label == "tenants":
        ensure_schema(connections[using])


def on_post_migrate(sender, using: str = "default", **kwargs) -> None:
    # Sent once per app after the whole plan ran: one app's signal covers every table.
    if sender.label == "tenants":
        apply_row_level_security(connections[using])
