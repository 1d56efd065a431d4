"""`manage.py set_credential --tenant SLUG NAME [--delete]` (the secret is read from
standard input)."""

import sys

from django.core.management.base import BaseCommand, CommandError

from gateway.credentials import delete_secret, set_secret
from tenants.models import Tenant

ACTOR = "command:set_credential"


class Command(BaseCommand):
    help = (
        "Store a credential in the in-process store (encrypted at rest). The secret is "
        "read from standard input, so it never appears in the shell history. With "
        "--delete, remove it. Either change is recorded in the tenant's audit chain."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="Credential name, as tools name it in credential_ref.")
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument("--delete", action="store_true", help="Delete the credential.")

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        name = options["name"]
        if options["delete"]:
            if not delete_secret(tenant=tenant, name=name, actor=ACTOR, via="command"):
                raise CommandError(f"No credential {name!r} for tenant {tenant.slug}.")
            self.stdout.write(f"Deleted credential {name} of tenant {tenant.slug}.")
            return
        secret = sys.stdin.read().strip("\r\n")
        if not secret:
            raise CommandError("No secret on standard input.")
        set_secret(tenant=tenant, name=name, secret=secret, actor=ACTOR, via="command")
        self.stdout.write(f"Stored credential {name} for tenant {tenant.slug}.")
