"""`eai_record_call(tenant, doc)`: a call's rows, audit links and feed events written in
one round trip on PostgreSQL (the invoke path's write).

It sets the tenant for row-level security (it runs as the caller: SECURITY INVOKER),
inserts the given rows, locks the tenant's log head, links each audit entry with
hash = SHA-256("<prev_hash>:<seq>:" || canonical) exactly as gateway/audit.py does,
numbers the feed events, and moves the head; all in the caller's transaction.
"""

from django.db import migrations

from gateway.migrations._functions import postgres_function

FUNCTION = r"""
CREATE OR REPLACE FUNCTION eai_record_call(p_tenant uuid, p_doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    item jsonb;
    cols text;
    head record;
    v_seq bigint;
    v_prev text;
    v_evseq bigint;
    v_hash text;
    v_hashes text[];
    v_prevs text[];
BEGIN
    PERFORM set_config('app.tenant_id', p_tenant::text, true);
    FOR item IN SELECT value FROM jsonb_array_elements(coalesce(p_doc -> 'inserts', '[]'))
    LOOP
        -- The invoke path's own tables as static statements: PL/pgSQL plans them once
        -- per session. Rows carry every column, so SELECT * lines up with the table.
        IF item ->> 'table' = 'gateway_decision' THEN
            INSERT INTO gateway_decision
                SELECT * FROM jsonb_populate_recordset(NULL::gateway_decision, item -> 'rows');
            CONTINUE;
        ELSIF item ->> 'table' = 'gateway_invocation' THEN
            INSERT INTO gateway_invocation
                SELECT * FROM jsonb_populate_recordset(NULL::gateway_invocation, item -> 'rows');
            CONTINUE;
        ELSIF item ->> 'table' = 'gateway_usageevent' THEN
            INSERT INTO gateway_usageevent
                SELECT * FROM jsonb_populate_recordset(NULL::gateway_usageevent, item -> 'rows');
            CONTINUE;
        END IF;
        SELECT string_agg(quote_ident(k), ', ') INTO cols
            FROM jsonb_object_keys(item -> 'rows' -> 0) AS k;
        EXECUTE format(
            'INSERT INTO %I (%s) SELECT %s FROM jsonb_populate_recordset(NULL::%I, $1) %s',
            item ->> 'table', cols, cols, item ->> 'table',
            CASE WHEN (item ->> 'ignore_conflicts')::boolean
                 THEN 'ON CONFLICT DO NOTHING' ELSE '' END
        ) USING item -> 'rows';
    END LOOP;
    IF jsonb_array_length(coalesce(p_doc -> 'audit', '[]')) = 0
       AND jsonb_array_length(coalesce(p_doc -> 'events', '[]')) = 0 THEN
        RETURN;
    END IF;
    SELECT audit_seq, audit_hash, event_seq INTO head
        FROM gateway_tenantlog WHERE tenant_id = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO gateway_tenantlog (tenant_id, audit_seq, audit_hash, event_seq)
            VALUES (p_tenant, 0, repeat('0', 64), 0) ON CONFLICT DO NOTHING;
        SELECT audit_seq, audit_hash, event_seq INTO head
            FROM gateway_tenantlog WHERE tenant_id = p_tenant FOR UPDATE;
    END IF;
    v_seq := head.audit_seq;
    v_prev := head.audit_hash;
    v_evseq := head.event_seq;
    -- Hashes chain one after the other; the rows then go in with one INSERT each table.
    v_hashes := ARRAY[]::text[];
    v_prevs := ARRAY[]::text[];
    FOR item IN SELECT value FROM jsonb_array_elements(coalesce(p_doc -> 'audit', '[]'))
    LOOP
        v_seq := v_seq + 1;
        v_hash := encode(sha256(convert_to(
            v_prev || ':' || v_seq::text || ':' || (item ->> 'canonical'), 'UTF8')), 'hex');
        v_prevs := v_prevs || v_prev;
        v_hashes := v_hashes || v_hash;
        v_prev := v_hash;
    END LOOP;
    INSERT INTO gateway_auditevent
        (tenant_id, seq, action, actor, object_ref, canonical, prev_hash, hash, created_at)
    SELECT p_tenant, head.audit_seq + a.n, a.value ->> 'action', a.value ->> 'actor',
           a.value ->> 'object_ref', a.value ->> 'canonical', v_prevs[a.n], v_hashes[a.n],
           (a.value ->> 'created_at')::timestamptz
    FROM jsonb_array_elements(coalesce(p_doc -> 'audit', '[]')) WITH ORDINALITY AS a(value, n);
    INSERT INTO gateway_event
        (id, tenant_id, sequence, type, run_id, invocation_id, refs, payload, created_at)
    SELECT e.value ->> 'id', p_tenant, v_evseq + e.n, e.value ->> 'type', e.value ->> 'run_id',
           e.value ->> 'invocation_id', e.value -> 'refs', e.value -> 'payload',
           (e.value ->> 'created_at')::timestamptz
    FROM jsonb_array_elements(coalesce(p_doc -> 'events', '[]')) WITH ORDINALITY AS e(value, n);
    v_evseq := v_evseq + jsonb_array_length(coalesce(p_doc -> 'events', '[]'));
    UPDATE gateway_tenantlog
        SET audit_seq = v_seq, audit_hash = v_prev, event_seq = v_evseq
        WHERE tenant_id = p_tenant;
END
$fn$;
"""


class Migration(migrations.Migration):
    dependencies = [("gateway", "0005_storedcredential_usageevent")]

    operations = [postgres_function(FUNCTION, "eai_record_call(uuid, jsonb)")]
