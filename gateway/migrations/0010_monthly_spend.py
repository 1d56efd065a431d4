"""MonthlySpend: a tenant's usage amounts per month and currency, so the budget check
reads a few rows instead of summing a month of usage events.

On PostgreSQL a trigger adds every usage row written to its month's total, whoever
writes it (the invoke path's `eai_record_call`, reported usage, code of an older
release still running during a deploy). Elsewhere `gateway.finops.add_spend` does it in
the same transaction. Existing usage is summed in, with writers held back meanwhile.
"""

import re
import zoneinfo
from decimal import ROUND_HALF_UP, Decimal

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _time_zone() -> str:
    name = settings.TIME_ZONE
    zoneinfo.ZoneInfo(name)  # a real zone, and below: nothing but a zone name's characters
    if not re.fullmatch(r"[A-Za-z0-9_+\-/]+", name):
        raise ValueError(f"unexpected TIME_ZONE {name!r}")
    return name


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    zone = _time_zone()
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"""
CREATE OR REPLACE FUNCTION eai_add_spend() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    -- Months of TIME_ZONE ({zone}), as gateway.finops.month_of counts them.
    INSERT INTO gateway_monthlyspend AS s (tenant_id, month, currency, amount)
    VALUES (NEW.tenant_id, date_trunc('month', NEW.occurred_at AT TIME ZONE '{zone}')::date,
            NEW.currency, NEW.amount)
    ON CONFLICT (tenant_id, month, currency) DO UPDATE SET amount = s.amount + EXCLUDED.amount;
    RETURN NULL;
END
$fn$;
"""
        )
        cursor.execute(
            "CREATE TRIGGER eai_usage_spend AFTER INSERT ON gateway_usageevent "
            "FOR EACH ROW WHEN (NEW.amount <> 0) EXECUTE FUNCTION eai_add_spend()"
        )


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS eai_usage_spend ON gateway_usageevent")
        schema_editor.execute("DROP FUNCTION IF EXISTS eai_add_spend()")


def sum_existing_usage(apps, schema_editor):
    """Each tenant's usage so far into MonthlySpend, tenant by tenant (row-level
    security shows a transaction only the rows of the tenant it set)."""
    connection = schema_editor.connection
    alias = connection.alias
    tenant_ids = list(apps.get_model("tenants", "Tenant").objects.using(alias).values_list("pk"))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Writers wait until this migration commits (the trigger's creation already
            # makes them): every row is counted once, here or by the trigger.
            cursor.execute("LOCK TABLE gateway_usageevent IN SHARE MODE")
            for (tenant_id,) in tenant_ids:
                cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_id)])
                cursor.execute(
                    "INSERT INTO gateway_monthlyspend (tenant_id, month, currency, amount) "
                    "SELECT tenant_id, date_trunc('month', occurred_at AT TIME ZONE %s)::date, "
                    "currency, SUM(amount) FROM gateway_usageevent "
                    "WHERE tenant_id = %s AND amount <> 0 GROUP BY 1, 2, 3",
                    [_time_zone(), tenant_id],
                )
        return
    usage_model = apps.get_model("gateway", "UsageEvent")
    spend_model = apps.get_model("gateway", "MonthlySpend")
    zone = zoneinfo.ZoneInfo(settings.TIME_ZONE)
    for (tenant_id,) in tenant_ids:
        totals: dict = {}
        rows = (
            usage_model.objects.using(alias)
            .filter(tenant_id=tenant_id)
            .exclude(amount=0)
            .values_list("occurred_at", "currency", "amount")
        )
        for occurred_at, currency, amount in rows.iterator(2000):
            key = (occurred_at.astimezone(zone).date().replace(day=1), currency)
            amount = Decimal(amount).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
            totals[key] = totals.get(key, Decimal(0)) + amount
        spend_model.objects.using(alias).bulk_create(
            spend_model(tenant_id=tenant_id, month=month, currency=currency, amount=amount)
            for (month, currency), amount in totals.items()
        )


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0009_settle_call_function"),
        ("tenants", "0002_tenant_budget_currency_tenant_monthly_budget"),
    ]

    operations = [
        migrations.CreateModel(
            name="MonthlySpend",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("month", models.DateField()),
                ("currency", models.CharField(max_length=3)),
                ("amount", models.DecimalField(decimal_places=6, default=0, max_digits=24)),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "month", "currency"), name="uniq_monthly_spend"
                    )
                ],
            },
        ),
        migrations.RunPython(create_trigger, drop_trigger),
        migrations.RunPython(sum_existing_usage, migrations.RunPython.noop),
    ]
