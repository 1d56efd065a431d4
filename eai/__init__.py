"""EAI Tool Gateway's Django project package."""

from eai.celery import app as celery_app

__all__ = ["celery_app"]
