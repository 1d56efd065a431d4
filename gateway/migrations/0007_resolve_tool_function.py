"""`eai_resolve_tool(tenant, name)`: the tool and the tenant's policy modules read in one
round trip on PostgreSQL (the invoke path's read), under the tenant's row-level
security (SECURITY INVOKER; it sets `app.tenant_id` for its own transaction)."""

from django.db import migrations

from gateway.migrations._functions import postgres_function

FUNCTION = r"""
CREATE OR REPLACE FUNCTION eai_resolve_tool(p_tenant uuid, p_name text) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('app.tenant_id', p_tenant::text, true);
    RETURN jsonb_build_object(
        'tool', (SELECT to_jsonb(t) FROM gateway_tool t
                 WHERE t.tenant_id = p_tenant AND t.name = p_name),
        'modules', coalesce((SELECT jsonb_agg(jsonb_build_array(m.name, m.rego) ORDER BY m.name)
                             FROM gateway_policymodule m WHERE m.tenant_id = p_tenant), '[]')
    );
END
$fn$;
"""


class Migration(migrations.Migration):
    dependencies = [("gateway", "0006_record_call_function")]

    operations = [postgres_function(FUNCTION, "eai_resolve_tool(uuid, text)")]
