"""`manage.py apply_manifests PATH… [--tenant SLUG] [--dry-run]`."""

import json
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from eai.parsers import load_yaml_documents
from gateway.manifests import ManifestInvalid, apply_manifests, split_documents
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Apply tool and policy manifests (YAML or JSON files) to a tenant, all or nothing."

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", help="Manifest files (.yaml, .yml, .json).")
        parser.add_argument(
            "--tenant", help="Tenant slug (may be left out when there is only one tenant)."
        )
        parser.add_argument("--dry-run", action="store_true", help="Validate and diff only.")

    def handle(self, *args, **options):
        if options["tenant"] is None:
            # As SPEC §8 writes the command: `apply_manifests PATH…`. A manifest names no
            # tenant, so the one tenant there is, or a clear refusal.
            tenants = list(Tenant.objects.filter(is_active=True).order_by("slug")[:21])
            if len(tenants) != 1:
                names = ", ".join(t.slug for t in tenants[:20]) or "none yet"
                raise CommandError(f"Name the tenant with --tenant SLUG (tenants: {names}).")
            tenant = tenants[0]
        else:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
        documents = []
        for name in options["paths"]:
            path = Path(name)
            try:
                text = path.read_text()
            except OSError as exc:
                raise CommandError(f"{name}: {exc.strerror}") from exc
            try:
                loaded = [json.loads(text)] if path.suffix == ".json" else load_yaml_documents(text)
            except (ValueError, yaml.YAMLError) as exc:
                raise CommandError(f"{name}: not valid YAML/JSON: {exc}") from exc
            for doc in loaded:
                documents.extend(split_documents(doc))
        try:
            results = apply_manifests(
                tenant=tenant, documents=documents, dry_run=options["dry_run"], actor="cli"
            )
        except ManifestInvalid as exc:
            for error in exc.errors:
                self.stderr.write(f"{error['manifest']}: {error['path']}: {error['message']}")
            raise CommandError("Invalid manifests; nothing was applied.") from exc
        for result in results:
            self.stdout.write(f"{result.kind} {result.name}@{result.version}: {result.status}")
