"""On PostgreSQL, audit events are append-only in the database itself: a trigger
rejects UPDATE and DELETE for every role (the owner included, unless it disables the
trigger, which verification then catches). TRUNCATE is left to grants (the app role
has no TRUNCATE), since test tooling flushes tables with it."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION eai_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only' USING ERRCODE = 'insufficient_privilege';
END
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS gateway_auditevent_append_only ON gateway_auditevent;
CREATE TRIGGER gateway_auditevent_append_only
    BEFORE UPDATE OR DELETE ON gateway_auditevent
    FOR EACH ROW EXECUTE FUNCTION eai_audit_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS gateway_auditevent_append_only ON gateway_auditevent;
DROP FUNCTION IF EXISTS eai_audit_append_only();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("gateway", "0002_audit_chain_and_events")]

    operations = [migrations.RunPython(forward, backward)]
