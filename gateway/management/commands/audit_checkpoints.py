"""`manage.py audit_checkpoints [--tenant SLUG] [--export]`: sign chain heads."""

import json

from django.core.management.base import BaseCommand, CommandError

from gateway.audit import export_checkpoints, write_checkpoint
from tenants.models import Tenant
from tenants.scope import tenant_scope


class Command(BaseCommand):
    help = (
        "Write a signed checkpoint (Ed25519) of each tenant's audit chain head and append "
        "it to the anchor log (EAI_AUDIT_ANCHOR_PATH); with --export, print every "
        "checkpoint as JSON lines to keep outside the database (`verify_audit --anchors`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant (slug).")
        parser.add_argument("--export", action="store_true", help="Print the checkpoints.")

    def handle(self, *args, **options):
        tenants = Tenant.objects.order_by("slug")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"No tenant {options['tenant']!r}.")
        for tenant in tenants:
            with tenant_scope(tenant):
                write_checkpoint(tenant)
                if options["export"]:
                    for line in export_checkpoints(tenant):
                        self.stdout.write(json.dumps(line))
