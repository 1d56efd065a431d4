from django.apps import AppConfig

from eai.integrations import otel


class GatewayConfig(AppConfig):
    name = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        otel.configure()
