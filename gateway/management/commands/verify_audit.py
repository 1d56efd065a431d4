"""`manage.py verify_audit [--tenant SLUG] [--anchors FILE] [--full]`: verify audit
chains, tenant by tenant, against their checkpoints and the anchor log."""

import json

from django.core.management.base import BaseCommand, CommandError

from gateway.audit import anchor_path, coverage_note, verify_chain
from tenants.models import Tenant
from tenants.scope import tenant_scope


class Command(BaseCommand):
    help = (
        "Verify each tenant's audit hash chain from the genesis, against its signed "
        "checkpoints and the anchor log kept outside the database; exit 1 if broken."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant (slug).")
        parser.add_argument(
            "--anchors",
            metavar="FILE",
            help="Check against this copy of the anchor log (as `audit_checkpoints "
            "--export` or the log itself holds it) instead of EAI_AUDIT_ANCHOR_PATH.",
        )
        parser.add_argument(
            "--full",
            action="store_true",
            help="Verify every link from the genesis. This is the only mode today, so it "
            "is also what runs without the flag.",
        )

    def handle(self, *args, **options):
        tenants = Tenant.objects.order_by("slug")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"No tenant {options['tenant']!r}.")
        anchors = options["anchors"]
        if anchors is not None:
            try:
                with open(anchors, "rb"):
                    pass
            except OSError as exc:
                raise CommandError(f"Cannot read the anchors file {anchors!r}: {exc}") from exc
        broken = []
        for tenant in tenants:
            with tenant_scope(tenant, readonly=True):
                result = verify_chain(tenant, anchors=anchors)  # full: the only mode
            self.stdout.write(json.dumps({"tenant": tenant.slug, **result}))
            if not result["valid"]:
                broken.append(tenant.slug)
        self.stderr.write(f"Anchor log: {anchors or anchor_path()}. {coverage_note()}")
        if broken:
            raise CommandError(f"Audit chain broken for: {', '.join(broken)}")
