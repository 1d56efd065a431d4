"""Budget reservations: a call reserves its cost before it runs, so concurrent calls
never spend past the tenant's monthly budget (SPEC §14).

`MonthlySpend.reserved` sums the `BudgetHold` rows of calls in flight. On PostgreSQL
`eai_reserve_budget` takes a hold in one round trip: it locks the month's spend row (so
a tenant's reservations of a month queue there, each reading what the one before it
left), compares spent + reserved + cost with the budget read from the tenant's row, and
holds the cost. Elsewhere `gateway.finops.reserve` does the same under SQLite's write
lock. On both databases a trigger releases a call's hold when its invocation reaches a
final status, whatever writes it (the invoke path's one-round-trip writes, a cancel, the
recovery sweep): the release is in the transaction of the result, never a write more.
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

from gateway.migrations._functions import postgres_function

# Invocation.STATUSES less Invocation.PENDING: a call in one of these has ended.
FINAL = "('succeeded', 'failed', 'denied', 'unavailable', 'timed_out', 'cancelled', 'expired')"

RESERVE = r"""
CREATE OR REPLACE FUNCTION eai_reserve_budget(
    p_tenant uuid, p_invocation text, p_month date, p_cost numeric
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    v_budget numeric;
    v_currency text;
    v_used numeric;
BEGIN
    PERFORM set_config('app.tenant_id', p_tenant::text, true);
    -- Not waiting for the WAL flush (this transaction only): a crash of the database
    -- can lose a hold taken in its last moments (the call's result, committed durably,
    -- is never lost), and each call is spared a second durable commit.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Read here, not from a cache: a budget set a moment ago holds at once.
    SELECT t.monthly_budget, t.budget_currency INTO v_budget, v_currency
        FROM tenants_tenant t WHERE t.id = p_tenant;
    IF v_budget IS NULL THEN
        RETURN jsonb_build_object('ok', true);
    END IF;
    INSERT INTO gateway_monthlyspend (tenant_id, month, currency, amount, reserved)
        VALUES (p_tenant, p_month, v_currency, 0, 0)
        ON CONFLICT (tenant_id, month, currency) DO NOTHING;
    -- The race: two calls reading the same remainder both went ahead. Holding this
    -- row's lock until commit makes the next reservation read the totals after ours.
    PERFORM 1 FROM gateway_monthlyspend s
        WHERE s.tenant_id = p_tenant AND s.month = p_month AND s.currency = v_currency
        FOR UPDATE;
    IF EXISTS (SELECT 1 FROM gateway_budgethold h WHERE h.invocation_id = p_invocation) THEN
        RETURN jsonb_build_object('ok', true);  -- held already (an async call, run now)
    END IF;
    SELECT coalesce(sum(s.amount + s.reserved), 0) INTO v_used FROM gateway_monthlyspend s
        WHERE s.tenant_id = p_tenant AND s.month >= p_month AND s.currency = v_currency;
    IF v_used + p_cost > v_budget THEN
        RETURN jsonb_build_object('ok', false, 'budget', v_budget::text, 'currency', v_currency);
    END IF;
    IF p_cost > 0 THEN
        UPDATE gateway_monthlyspend s SET reserved = s.reserved + p_cost
            WHERE s.tenant_id = p_tenant AND s.month = p_month AND s.currency = v_currency;
        INSERT INTO gateway_budgethold (invocation_id, tenant_id, month, currency, amount, created_at)
            VALUES (p_invocation, p_tenant, p_month, v_currency, p_cost, now());
    END IF;
    RETURN jsonb_build_object('ok', true);
END
$fn$;
"""

RELEASE_PG = r"""
CREATE OR REPLACE FUNCTION eai_release_budget() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    h record;
BEGIN
    DELETE FROM gateway_budgethold WHERE invocation_id = NEW.id
        RETURNING month, currency, amount INTO h;
    IF FOUND THEN
        UPDATE gateway_monthlyspend s SET reserved = s.reserved - h.amount
            WHERE s.tenant_id = NEW.tenant_id AND s.month = h.month AND s.currency = h.currency;
    END IF;
    RETURN NULL;
END
$fn$;
"""

# SQLite keeps decimals as floating point: ROUND to the column's 6 places so that a
# long run of holds and releases does not drift.
RELEASE_SQLITE_BODY = """
BEGIN
    UPDATE gateway_monthlyspend SET reserved = ROUND(reserved - (
        SELECT h.amount FROM gateway_budgethold h WHERE h.invocation_id = NEW.id), 6)
    WHERE (tenant_id, month, currency) = (
        SELECT h.tenant_id, h.month, h.currency FROM gateway_budgethold h
        WHERE h.invocation_id = NEW.id);
    DELETE FROM gateway_budgethold WHERE invocation_id = NEW.id;
END
"""


def create_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(RELEASE_PG)
        body = "EXECUTE FUNCTION eai_release_budget()"
    elif vendor == "sqlite":
        body = RELEASE_SQLITE_BODY
    else:
        return
    schema_editor.execute(
        "CREATE TRIGGER eai_release_budget_insert AFTER INSERT ON gateway_invocation "
        f"FOR EACH ROW WHEN (NEW.status IN {FINAL}) {body}"
    )
    schema_editor.execute(
        "CREATE TRIGGER eai_release_budget_update AFTER UPDATE OF status ON gateway_invocation "
        f"FOR EACH ROW WHEN (NEW.status IN {FINAL} AND OLD.status NOT IN {FINAL}) {body}"
    )


def drop_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for name in ("eai_release_budget_insert", "eai_release_budget_update"):
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON gateway_invocation")
        elif vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
    if vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS eai_release_budget()")


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0012_idempotency_invocation"),
        ("tenants", "0003_apikey_created_by_protect"),
    ]

    operations = [
        migrations.AddField(
            model_name="monthlyspend",
            name="reserved",
            field=models.DecimalField(decimal_places=6, default=0, db_default=0, max_digits=24),
        ),
        migrations.CreateModel(
            name="BudgetHold",
            fields=[
                (
                    "invocation_id",
                    models.CharField(max_length=40, primary_key=True, serialize=False),
                ),
                ("month", models.DateField()),
                ("currency", models.CharField(max_length=3)),
                ("amount", models.DecimalField(decimal_places=6, max_digits=24)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tenants.tenant",
                    ),
                ),
            ],
        ),
        postgres_function(RESERVE, "eai_reserve_budget(uuid, text, date, numeric)"),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
