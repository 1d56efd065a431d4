"""`manage.py mcp_discover URL [--tenant SLUG --credential NAME]`: draft Tool manifests."""

import yaml
from django.core.management.base import BaseCommand, CommandError

from gateway import credentials, mcp_client, mcp_sync
from gateway.endpoints import resolved_refusal
from tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "List the tools of the MCP server at URL and print a draft Tool manifest for each "
        "(YAML, pins included), for review before apply_manifests."
    )

    def add_arguments(self, parser):
        parser.add_argument("url", help="The MCP server's Streamable HTTP URL.")
        parser.add_argument("--tenant", help="Tenant slug whose credential to use.")
        parser.add_argument(
            "--credential", help="Credential (set_credential NAME) to send as the server's key."
        )
        parser.add_argument(
            "--header",
            default="Authorization",
            help="Header the credential goes in (default Authorization).",
        )
        parser.add_argument("--template", default="Bearer {secret}", help="Header value template.")
        parser.add_argument("--timeout", type=float, default=10.0, help="Seconds (default 10).")

    def handle(self, *args, **options):
        url = options["url"]
        reason = resolved_refusal(url)
        if reason:
            raise CommandError(f"{url}: forbidden: {reason}")
        headers: dict[str, str] = {}
        lease = None
        if options["credential"]:
            if not options["tenant"]:
                raise CommandError("--credential needs --tenant SLUG.")
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
            try:
                lease = credentials.lease(tenant, options["credential"])
            except credentials.CredentialUnavailable as exc:
                raise CommandError(f"credential {options['credential']!r}: {exc}") from exc
            injection = {"header": options["header"], "template": options["template"]}
            headers = lease.headers(injection)
        try:
            definitions = mcp_client.list_definitions(
                url, headers=headers, timeout_s=options["timeout"]
            )
        except mcp_client.MCPCallError as exc:
            raise CommandError(f"{url}: the MCP server could not be read ({exc.code})") from exc
        finally:
            if lease is not None:
                lease.revoke()
        drafts = mcp_sync.draft_manifests(url, definitions, credential=options["credential"])
        if options["credential"] and (
            options["header"] != "Authorization" or options["template"] != "Bearer {secret}"
        ):
            for draft in drafts:
                draft["spec"]["credential_injection"] = {
                    "header": options["header"],
                    "template": options["template"],
                }
        left_out = len(definitions) - len(drafts)
        if left_out:
            self.stderr.write(f"{left_out} tool(s) left out: {mcp_client.UNCANONICAL}.")
        self.stdout.write(
            f"# {len(drafts)} draft Tool manifest(s) from {url}: review each (name, "
            "description, scopes, risk) before apply_manifests; the pins fix the definitions "
            "reviewed.\n"
        )
        self.stdout.write(
            yaml.safe_dump_all(drafts, sort_keys=False, allow_unicode=True, width=100)
        )
