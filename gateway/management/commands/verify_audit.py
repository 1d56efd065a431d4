"""`manage.py verify_audit [--tenant SLUG]`: verify audit chains, tenant by tenant."""

import json

from django.core.management.base import BaseCommand, CommandError

from gateway.audit import verify_chain
from tenants.models import Tenant
from tenants.scope import tenant_scope


class Command(BaseCommand):
    help = "Verify each tenant's audit hash chain and signed checkpoints; exit 1 if broken."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant (slug).")

    def handle(self, *args, **options):
        tenants = Tenant.objects.order_by("slug")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"No tenant {options['tenant']!r}.")
        broken = []
        for tenant in tenants:
            with tenant_scope(tenant, readonly=True):
                result = verify_chain(tenant)
            self.stdout.write(json.dumps({"tenant": tenant.slug, **result}))
            if not result["valid"]:
                broken.append(tenant.slug)
        if broken:
            raise CommandError(f"Audit chain broken for: {', '.join(broken)}")
