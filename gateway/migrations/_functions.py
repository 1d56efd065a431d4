"""The migration operation of the PL/pgSQL functions the invoke path calls (0006, 0007,
0009). They exist on PostgreSQL only; elsewhere the same writes go through the ORM.
(A module whose name starts with `_` is not read as a migration.)"""

from functools import partial

from django.db import migrations


def _create(sql, apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # A cursor without parameters: format()'s %I and %s must reach PostgreSQL as is.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(sql)


def _drop(signature, apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {signature}")


def postgres_function(sql: str, signature: str) -> migrations.RunPython:
    """Create the function `sql` defines; reversing drops `signature` (`name(types)`)."""
    return migrations.RunPython(partial(_create, sql), partial(_drop, signature))
