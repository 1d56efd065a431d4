from django.apps import AppConfig

from eai.integrations import otel


class GatewayConfig(AppConfig):
    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from gateway import audit

        otel.configure()
        checks.register(audit.check_audit_keys, checks.Tags.security)
