"""WSGI entry point (gunicorn eai.wsgi)."""

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eai.settings")
django_application = get_wsgi_application()

from eai.bulkheads import RequestSlots  # noqa: E402 - once Django is set up
from eai.front import Front  # noqa: E402

# The invoke route is served by the front, everything else by Django (eai/front.py);
# every request holds a slot of its tenant (or the keyless one) while it is served.
application = RequestSlots(Front(django_application))


def _settle_memory() -> None:
    """Load the URLconf (and with it every view and the pipeline) now, then move the
    ~130,000 objects of a loaded app out of the collector's sight: a full collection
    over them took 80 ms and fell on whichever request was unlucky. Young-generation
    collections are spaced out too, since a request allocates a few thousand objects
    that mostly die with it."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports the views
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


_settle_memory()
