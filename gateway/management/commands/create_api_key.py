"""`manage.py create_api_key --tenant SLUG --scopes a,b [--agent NAME] [--json]`."""

import json
import re

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from gateway.keys import issue_api_key
from tenants.models import Tenant

SCOPE_RE = re.compile(r"^[A-Za-z0-9_.\-]+:[A-Za-z0-9_.\-*]+$")


class Command(BaseCommand):
    help = "Create an API key for a tenant and print it once (only its digest is stored)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument(
            "--scopes", required=True, help="Comma-separated scopes, e.g. tools:invoke,tools:read"
        )
        parser.add_argument("--agent", default="", help="Name of the agent using the key.")
        parser.add_argument("--name", default="", help="A label for the key.")
        parser.add_argument(
            "--user",
            default="",
            help="Username of a staff member of the tenant the key is issued to: such a key "
            "(with approvals:read/approvals:decide) is how a reviewer decides through the API.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print exactly one JSON line with the key."
        )

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        bad = [s for s in scopes if not SCOPE_RE.match(s)]
        if bad or not scopes:
            raise CommandError(f"Invalid scopes {bad or scopes!r}: use name:verb.")
        user = None
        if options["user"]:
            user = (
                get_user_model()
                .objects.filter(
                    username=options["user"],
                    is_active=True,
                    is_staff=True,
                    memberships__tenant=tenant,
                )
                .first()
            )
            if user is None:
                raise CommandError(
                    f"No active staff user {options['user']!r} in tenant {tenant.slug!r}."
                )
        key, raw = issue_api_key(
            tenant=tenant, scopes=scopes, agent=options["agent"], name=options["name"], user=user
        )
        if options["json"]:
            line = {
                "id": key.public_id,
                "key": raw,
                "tenant": tenant.slug,
                "scopes": scopes,
                "agent": key.agent,
            }
            self.stdout.write(json.dumps(line))
        else:
            self.stdout.write(f"API key {key.public_id} for tenant {tenant.slug}:")
            self.stdout.write(raw)
            self.stdout.write("Store it now: it is not shown again.")
