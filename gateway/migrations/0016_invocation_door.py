"""The door a call came through (REST invoke or MCP tools/call).

Added with one ALTER TABLE on every database: Django's own AddField of a NOT NULL column
rebuilds the whole table on SQLite, which drops the table's triggers (the budget
release triggers of 0013).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0015_policy_module_budget_flag"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="invocation",
                    name="door",
                    field=models.CharField(
                        choices=[("rest", "rest"), ("mcp", "mcp")], default="rest", max_length=8
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE gateway_invocation "
                    "ADD COLUMN door varchar(8) NOT NULL DEFAULT 'rest'",
                    reverse_sql="ALTER TABLE gateway_invocation DROP COLUMN door",
                ),
            ],
        ),
    ]
