"""`manage.py mcp_resync [--tenant SLUG]`: read `mcp` tools' upstream definitions again."""

from django.core.management.base import BaseCommand, CommandError

from gateway import mcp_sync
from tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Read every mcp tool's definition on its MCP server again; a tool whose definition "
        "changed is closed (503, availability definition_changed, audit tool.drift) until "
        "its manifest is applied again."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant (slug); every tenant by default.")

    def handle(self, *args, **options):
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
            checked = [(tenant.slug, c) for c in mcp_sync.resync_tenant(tenant)]
        else:
            checked = mcp_sync.resync_all()
        for slug, c in checked:
            line = f"{slug} {c.tool}: {c.outcome}"
            if c.outcome == "drift":
                line += f" (pinned {c.pinned}, found {c.found})"
            self.stdout.write(line)
        drifted = sum(c.outcome == "drift" for _slug, c in checked)
        self.stdout.write(f"{len(checked)} mcp tool(s) checked, {drifted} drifted.")
