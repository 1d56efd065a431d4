"""MonthlySpend: a tenant's usage amounts per month and currency, so the budget check
reads a few rows instead of summing a month of usage events.

`eai_record_call` (0006) learns the document's `spend` list: it adds each amount to its
row in the same transaction as the call's usage event. Existing usage is summed in.
"""

import importlib
import zoneinfo
from decimal import Decimal

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from gateway.migrations._functions import postgres_function

_RECORD_CALL = importlib.import_module("gateway.migrations.0006_record_call_function").FUNCTION
_BEFORE = "    IF jsonb_array_length(coalesce(p_doc -> 'audit', '[]')) = 0\n"
_SPEND = """    IF p_doc ? 'spend' THEN
        -- Usage amounts per month and currency (gateway.models.MonthlySpend).
        INSERT INTO gateway_monthlyspend AS s (tenant_id, month, currency, amount)
            SELECT p_tenant, (x ->> 'month')::date, x ->> 'currency', (x ->> 'amount')::numeric
            FROM jsonb_array_elements(p_doc -> 'spend') AS x
        ON CONFLICT (tenant_id, month, currency)
            DO UPDATE SET amount = s.amount + EXCLUDED.amount;
    END IF;
"""
assert _RECORD_CALL.count(_BEFORE) == 1
RECORD_CALL = _RECORD_CALL.replace(_BEFORE, _SPEND + _BEFORE)


def sum_existing_usage(apps, schema_editor):
    """Each tenant's usage so far into MonthlySpend, tenant by tenant (row-level
    security shows a transaction only the rows of the tenant it set)."""
    alias = schema_editor.connection.alias
    tenant_model = apps.get_model("tenants", "Tenant")
    usage_model = apps.get_model("gateway", "UsageEvent")
    spend_model = apps.get_model("gateway", "MonthlySpend")
    zone = zoneinfo.ZoneInfo(settings.TIME_ZONE)
    for tenant_id in tenant_model.objects.using(alias).values_list("pk", flat=True):
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_id)])
        totals: dict = {}
        rows = (
            usage_model.objects.using(alias)
            .filter(tenant_id=tenant_id)
            .exclude(amount=0)
            .values_list("occurred_at", "currency", "amount")
        )
        for occurred_at, currency, amount in rows.iterator(2000):
            key = (occurred_at.astimezone(zone).date().replace(day=1), currency)
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
        migrations.RunPython(sum_existing_usage, migrations.RunPython.noop),
        migrations.RunPython(
            postgres_function(RECORD_CALL, "eai_record_call(uuid, jsonb)").code,
            postgres_function(_RECORD_CALL, "eai_record_call(uuid, jsonb)").code,
        ),
    ]
