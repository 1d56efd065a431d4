"""`manage.py serve`: the embedded server `make run` uses.

One gunicorn worker process with threads, so the in-memory fallbacks (rate limits,
breakers, the in-process task runner) are exact; plus the demo upstream on a thread.
"""

import logging
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection
from gunicorn.app.base import BaseApplication

from eai.celery import app as celery_app
from eai.wsgi import application
from gateway import demo

logger = logging.getLogger(__name__)


def run_schedule(stop: threading.Event) -> None:
    """Celery beat's schedule, run in this process when there is no broker (the
    approval expiry sweeper, audit checkpoints). Each job is idempotent."""
    celery_app.autodiscover_tasks(lambda: settings.INSTALLED_APPS, force=True)
    due = dict.fromkeys(settings.CELERY_BEAT_SCHEDULE, 0.0)
    while not stop.wait(1.0):
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
            if time.monotonic() < due[name]:
                continue
            try:
                celery_app.tasks[entry["task"]]()
            except Exception:
                logger.exception("scheduled job %s failed", name)
            finally:
                connection.close()
            due[name] = time.monotonic() + float(entry["schedule"])


class _Gunicorn(BaseApplication):
    def __init__(self, options: dict) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self):
        return application


class Command(BaseCommand):
    help = "Serve the portal and API (gunicorn, one worker with threads) and the demo upstream."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument("--threads", type=int, default=16)
        parser.add_argument(
            "--no-upstream", action="store_true", help="Do not start the demo upstream."
        )

    def handle(self, *args, **options):
        if not options["no_upstream"]:
            demo.start_upstream(settings.EAI_DEMO_UPSTREAM_PORT)
            self.stdout.write(
                f"Demo upstream on http://127.0.0.1:{settings.EAI_DEMO_UPSTREAM_PORT}"
            )
            try:
                demo.McpUpstream(settings.EAI_DEMO_MCP_PORT)
                self.stdout.write(
                    f"Demo MCP server on http://127.0.0.1:{settings.EAI_DEMO_MCP_PORT}/mcp"
                )
            except OSError as exc:
                self.stderr.write(f"Demo MCP server not started: {exc}")
        if not settings.EAI_BROKER_URL:
            threading.Thread(
                target=run_schedule, args=(threading.Event(),), name="schedule", daemon=True
            ).start()
        self.stdout.write(f"Serving on http://{options['bind']} (Ctrl-C to stop)")
        _Gunicorn(
            {
                "bind": options["bind"],
                "workers": 1,
                "threads": options["threads"],
                # gthread, with each request given to the thread idle the shortest time
                # (its database connection still warm): see eai/workers.py.
                "worker_class": "eai.workers.LifoThreadWorker",
                "timeout": 120,
                "accesslog": "-",
                "access_log_format": '%(h)s "%(r)s" %(s)s %(b)s %(M)sms',
            }
        ).run()
