"""`manage.py create_tenant SLUG [--name NAME]`."""

from django.core.management.base import BaseCommand, CommandError
from django.utils.text import slugify

from tenants.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant (or report the existing one with that slug)."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="Short unique identifier, e.g. acme.")
        parser.add_argument("--name", help="Display name (defaults to the slug).")

    def handle(self, *args, **options):
        slug = options["slug"]
        if slugify(slug) != slug:
            raise CommandError(f"Invalid slug {slug!r}: use lowercase letters, digits and '-'.")
        tenant, created = Tenant.objects.get_or_create(
            slug=slug, defaults={"name": options["name"] or slug}
        )
        verb = "Created" if created else "Exists"
        self.stdout.write(f"{verb} tenant {tenant.slug} ({tenant.public_id})")
