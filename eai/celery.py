"""The Celery app (worker: `celery -A eai worker`, beat: `celery -A eai beat`)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eai.settings")

app = Celery("eai")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
