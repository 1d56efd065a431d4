"""`eai_settle_call`: the second write of a non-idempotent call in one round trip.

A non-idempotent call commits a `running` claim before its upstream call (so a crash
leaves a trace, never a silent second execution). Its result then moves the claim to
its final state, once, with its usage, artifact, audit links and feed event: a
conditional UPDATE (the row must still be `running`) and, only if it moved,
`eai_record_call` for the rest. Returns whether it moved. The columns are those of
`gateway.audit.SETTLE_FIELDS`; a JSON null becomes SQL NULL, as the ORM stores None.
"""

from django.db import migrations

from gateway.migrations._functions import postgres_function

FUNCTION = r"""
CREATE OR REPLACE FUNCTION eai_settle_call(p_tenant uuid, p_doc jsonb) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    s jsonb := p_doc -> 'settle';
BEGIN
    PERFORM set_config('app.tenant_id', p_tenant::text, true);
    UPDATE gateway_invocation SET
        status = s ->> 'status',
        sealed_input = NULL,
        output = NULLIF(s -> 'output', 'null'::jsonb),
        error = NULLIF(s -> 'error', 'null'::jsonb),
        redactions = coalesce(s -> 'redactions', '[]'::jsonb),
        cost_amount = (s ->> 'cost_amount')::numeric,
        cost_currency = coalesce(s ->> 'cost_currency', ''),
        finished_at = (s ->> 'finished_at')::timestamptz
    WHERE tenant_id = p_tenant AND id = s ->> 'id' AND status = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM eai_record_call(p_tenant, p_doc);
    RETURN true;
END
$fn$;
"""


class Migration(migrations.Migration):
    dependencies = [("gateway", "0008_hot_path_indexes")]

    operations = [postgres_function(FUNCTION, "eai_settle_call(uuid, jsonb)")]
