from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants import rls  # noqa: PLC0415 - rls reads every app's models

        pre_migrate.connect(rls.on_pre_migrate, sender=self)
        post_migrate.connect(rls.on_post_migrate, sender=self)
