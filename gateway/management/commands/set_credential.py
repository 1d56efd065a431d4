"""`manage.py set_credential --tenant SLUG NAME` (the secret is read from standard input)."""

import sys

from django.core.management.base import BaseCommand, CommandError

from gateway.credentials import set_secret
from tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Store a credential in the in-process store (encrypted at rest). The secret is "
        "read from standard input, so it never appears in the shell history."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="Credential name, as tools name it in credential_ref.")
        parser.add_argument("--tenant", required=True, help="Tenant slug.")

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        secret = sys.stdin.read().strip("\r\n")
        if not secret:
            raise CommandError("No secret on standard input.")
        set_secret(tenant=tenant, name=options["name"], secret=secret)
        self.stdout.write(f"Stored credential {options['name']} for tenant {tenant.slug}.")
