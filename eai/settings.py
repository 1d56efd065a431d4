"""Settings for EAI Tool Gateway: one file, configured by environment variables.

Without any variable set this is the embedded default that `make run` serves: SQLite in
WAL mode, tasks in process, in-process Rego and credential store. Production switches
each part on by its variable (see README.md, "Configuration").
"""

import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from eai.keyfiles import read_or_create

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


EAI_DB_SCHEMA = env("EAI_DB_SCHEMA", "eai")
EAI_DB_APP_ROLE = env("EAI_DB_APP_ROLE", "eai_app")


def database_from_url(url: str) -> dict:
    """Django DATABASES entry for a `postgres://user:pass@host:port/name?opt=v` URL.

    Tables live in the `eai` schema (created before the first migration).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"EAI_DATABASE_URL: unsupported scheme {parts.scheme!r}")
    options = dict(parse_qsl(parts.query))
    options.setdefault("options", f"-c search_path={EAI_DB_SCHEMA},public")
    # Server-side binding lets psycopg prepare the statements the hot path repeats, so
    # PostgreSQL plans each once per connection instead of on every call.
    options.setdefault("server_side_binding", True)
    options.setdefault("prepare_threshold", 2)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        "CONN_MAX_AGE": env_int("EAI_DB_CONN_MAX_AGE", 60),
        # No health check query before each request's first statement: it would cost a
        # round trip on every call; a connection found broken is replaced at request end.
        "CONN_HEALTH_CHECKS": False,
    }


def _secret_key() -> str:
    """EAI_SECRET_KEY, else a key generated once into a git-ignored file.

    Every process of the checkout (server, commands, workers) reads the same file, so
    sessions and encrypted rows written by one are readable by the others.
    """
    key = env("EAI_SECRET_KEY")
    if key:
        return key
    return read_or_create(BASE_DIR / ".eai-secret-key", lambda: secrets.token_urlsafe(50))


SECRET_KEY = _secret_key()
DEBUG = env_bool("EAI_DEBUG", False)
# Exact hosts (SPEC §7); Django's test runner adds its own "testserver" when it runs.
ALLOWED_HOSTS = env_list("EAI_ALLOWED_HOSTS", "127.0.0.1,localhost")
# A pod's own address (the Helm chart sets it from status.podIP): Prometheus scrapes
# `/metrics` by pod IP, which is then the request's Host.
if env("EAI_POD_IP"):
    ALLOWED_HOSTS.append(env("EAI_POD_IP"))
CSRF_TRUSTED_ORIGINS = env_list(
    "EAI_CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000"
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "guardian",
    "tenants",
    "gateway",
    "approvals",
]

MIDDLEWARE = [
    "eai.middleware.RequestIdMiddleware",
    "eai.middleware.NulRefusalMiddleware",
    "eai.middleware.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "eai.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "eai.middleware.AuthenticationMiddleware",
    "eai.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "eai.urls"
WSGI_APPLICATION = "eai.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.portal.portal_context",
            ],
        },
    },
]

if env("EAI_DATABASE_URL"):
    DATABASES = {"default": database_from_url(env("EAI_DATABASE_URL"))}
    if env("EAI_MIGRATE_DATABASE_URL"):
        # The tables' owner, for `manage.py migrate --database migrate` only; the app
        # itself connects as a role that owns nothing and cannot bypass RLS.
        DATABASES["migrate"] = database_from_url(env("EAI_MIGRATE_DATABASE_URL"))
        DATABASES["migrate"]["TEST"] = {"MIRROR": "default"}
else:
    # WAL lets readers run beside the writer; IMMEDIATE takes the write lock at BEGIN so
    # two writers queue on the timeout instead of failing with "database is locked"
    # when a read transaction tries to upgrade.
    DATABASES = {
        "default": {
            "ENGINE": "eai.sqlite",  # Django's, with writers queued per process
            "NAME": env("EAI_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                # SQLite copies the WAL back into the database inside the commit that
                # fills it to this many pages; at its default (1,000, about 32 calls
                # here) that call took ~28 ms instead of ~7, 3 % of calls: the whole
                # p99. At 4,000 (a 16 MB WAL) it is 0.8 % of calls and less copying in
                # all, since pages rewritten in between are copied once.
                "init_command": (
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                    "PRAGMA wal_autocheckpoint=4000;"
                ),
            },
            # Kept open across requests (one per thread): opening a SQLite connection
            # reads the schema and runs the PRAGMAs, and closing the last one on a WAL
            # database checkpoints it: per request, that tripled an invoke's CPU.
            "CONN_MAX_AGE": None,
            # A file, not Django's in-memory default: shared-cache memory databases lock
            # whole tables and ignore the busy timeout, so concurrent tests would fail.
            "TEST": {"NAME": env("EAI_SQLITE_TEST_PATH", str(BASE_DIR / "test-db.sqlite3"))},
        }
    }
# The failed-login limit counts in this cache. LocMem is per process: a deployment with
# several processes should set EAI_CACHE_URL to a shared Redis (e.g. redis://host:6379/1,
# a database other than the broker's) so the limit holds across them.
if env("EAI_CACHE_URL"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": env("EAI_CACHE_URL"),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses every attempt while a username or IP is locked out (tenants/lockout.py).
    "tenants.lockout.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("fr", "Français")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "Europe/Paris"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Unset by default: WhiteNoise serves the apps' static files straight from their folders.
STATIC_ROOT = env("EAI_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
if env_bool("EAI_HTTPS", False):
    SECURE_SSL_REDIRECT = True
    # In-cluster scrapes and probes speak plain HTTP to the pod (no proxy in between).
    SECURE_REDIRECT_EXEMPT = [r"^metrics$", r"^healthz$", r"^readyz$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.auth.HasScope"],
    "DEFAULT_PARSER_CLASSES": ["eai.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "eai.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "EAI Tool Gateway API",
    "DESCRIPTION": "The governed door through which AI agents use tools.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "OAS_VERSION": "3.1.0",
    # Every body a named component, every status an operation can answer (gateway/openapi.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gateway.openapi.describe",
    ],
}

# Product settings.
EAI_MAX_REQUEST_BYTES = env_int("EAI_MAX_REQUEST_BYTES", 1024 * 1024)
# Long polls (`?wait=S`) one server process holds at once; more answer at once instead
# of waiting, so waiting clients never take every request thread (make run has 16).
EAI_LONG_POLL_SLOTS = env_int("EAI_LONG_POLL_SLOTS", 4)
# Bulkheads (SPEC §14, eai/bulkheads.py): one tenant (or all keyless requests together)
# holds at most this share of a process's request slots and of its task threads, and
# never fewer than EAI_TENANT_MIN_SLOTS; past it a request answers 429 at once.
EAI_TENANT_SHARE = float(env("EAI_TENANT_SHARE", "0.5"))
EAI_TENANT_MIN_SLOTS = env_int("EAI_TENANT_MIN_SLOTS", 8)
# Request slots of a process when the server does not say (gunicorn's --threads does;
# eai.workers.InlineWorker serves this many at once unless --threads is given).
EAI_REQUEST_SLOTS = env_int("EAI_REQUEST_SLOTS", 16)
# Threads running queued calls in a server process without a broker.
EAI_TASK_THREADS = env_int("EAI_TASK_THREADS", 16)
# Calls one tenant may have queued (`Prefer: respond-async`) at once; past it 429
# `rate_limited` (Retry-After), so its flood never stands in front of another tenant's
# queued call for longer than that many calls. 0: no bound.
EAI_TENANT_QUEUED_MAX = env_int("EAI_TENANT_QUEUED_MAX", 256)
# Slow clients (eai/workers.py): a request's headers must arrive within this many
# seconds, and its body within EAI_BODY_TIMEOUT_S after them; else 408 and closed.
EAI_HEADER_TIMEOUT_S = float(env("EAI_HEADER_TIMEOUT_S", "10"))
EAI_BODY_TIMEOUT_S = float(env("EAI_BODY_TIMEOUT_S", "15"))
# Django refuses larger bodies itself; ours is answered first with the envelope.
DATA_UPLOAD_MAX_MEMORY_SIZE = EAI_MAX_REQUEST_BYTES + 1
EAI_MAX_RESULT_BYTES = env_int("EAI_MAX_RESULT_BYTES", 256 * 1024)
EAI_MAX_JSON_DEPTH = 100
# Hosts tool endpoints may use; empty means any host except link-local and metadata.
EAI_ALLOWED_TOOL_HOSTS = env_list("EAI_ALLOWED_TOOL_HOSTS")
# Proxies (addresses or CIDRs) whose X-Forwarded-For names the client, for the admin's
# login lockout (tenants/lockout.py); from anyone else the header is ignored.
EAI_TRUSTED_PROXIES = env_list("EAI_TRUSTED_PROXIES")
for _proxy in EAI_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(
            f"EAI_TRUSTED_PROXIES: {_proxy!r} is not an address or CIDR"
        ) from _exc
# Browser origins allowed to call `/v1/mcp` (exact `scheme://host[:port]`, or `*`). A
# request with any other `Origin` header is refused (DNS rebinding: a web page must not
# drive a local MCP server); requests without one (desktop and IDE hosts, agents) pass.
EAI_MCP_ALLOWED_ORIGINS = env_list("EAI_MCP_ALLOWED_ORIGINS")
EAI_OPA_URL = env("EAI_OPA_URL")
EAI_OPA_TIMEOUT_S = float(env("EAI_OPA_TIMEOUT_S", "2"))
# A decision with a tenant's policy modules: its CPU and memory budget, and the evaluator
# processes a serving process keeps for them (one tenant holds at most half, at least 1).
EAI_POLICY_CPU_MS = env_int("EAI_POLICY_CPU_MS", 250)
EAI_POLICY_MEMORY_MB = env_int("EAI_POLICY_MEMORY_MB", 256)
EAI_POLICY_EVALUATORS = env_int("EAI_POLICY_EVALUATORS", 4)
EAI_DEMO_UPSTREAM_PORT = env_int("EAI_DEMO_UPSTREAM_PORT", 8001)
# The demo MCP server (kb.search, an `mcp` endpoint), beside the demo upstream.
EAI_DEMO_MCP_PORT = env_int("EAI_DEMO_MCP_PORT", 8002)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("EAI_LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}

# Redis and Celery. Without a broker URL, tasks run in threads of the serving process.
EAI_REDIS_URL = env("EAI_REDIS_URL")
EAI_BROKER_URL = env("EAI_BROKER_URL", EAI_REDIS_URL)
CELERY_BROKER_URL = EAI_BROKER_URL or "memory://"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Longer than any countdown we use: Redis redelivers unacknowledged tasks after this.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 2 * 3600}
CELERY_TASK_IGNORE_RESULT = True
# A call still `running` this long after its timeout belongs to a dead process.
EAI_STUCK_GRACE_S = float(env("EAI_STUCK_GRACE_S", "60"))
# Seconds between re-reads of `mcp` endpoints' tool definitions (the pin check).
EAI_MCP_RESYNC_S = float(env("EAI_MCP_RESYNC_S", "300"))
# Periodic jobs. `manage.py serve` runs the same schedule in a thread without a broker.
CELERY_BEAT_SCHEDULE: dict = {
    "expire-approvals": {"task": "approvals.tasks.expire_approvals", "schedule": 15.0},
    "audit-checkpoints": {
        "task": "gateway.tasks.write_checkpoints",
        "schedule": float(env("EAI_AUDIT_CHECKPOINT_INTERVAL_S", "300")),
    },
    "deliver-usage": {"task": "gateway.tasks.deliver_usage", "schedule": 30.0},
    "purge-idempotency": {"task": "gateway.tasks.purge_idempotency", "schedule": 3600.0},
    "recover-stuck": {"task": "gateway.tasks.recover_stuck", "schedule": 30.0},
    # Re-read `mcp` tools' upstream definitions: a changed one closes its tool (SPEC §10).
    "mcp-resync": {"task": "gateway.tasks.mcp_resync", "schedule": EAI_MCP_RESYNC_S},
}
# Ed25519 key signing audit checkpoints (base64 of 32 raw bytes); generated once into
# the git-ignored .eai-audit-key when unset.
EAI_AUDIT_SIGNING_KEY = env("EAI_AUDIT_SIGNING_KEY")
# Public keys (base64 of 32 raw bytes, comma-separated) of earlier signing keys whose
# checkpoints are still trusted after a rotation. A checkpoint signed by any other key
# makes its chain invalid.
EAI_AUDIT_RETIRED_KEYS = [k.strip() for k in env("EAI_AUDIT_RETIRED_KEYS").split(",") if k.strip()]
# The anchor log: every checkpoint is also appended here, outside the database, and
# verification checks the chain against it. The embedded default keeps it in a
# git-ignored file of the checkout; production points it at a separate volume.
EAI_AUDIT_ANCHOR_PATH = env("EAI_AUDIT_ANCHOR_PATH", str(BASE_DIR / ".eai-audit-anchors.jsonl"))

# Credentials: OpenBao when EAI_BAO_ADDR is set, else the in-process encrypted store.
EAI_BAO_ADDR = env("EAI_BAO_ADDR")
EAI_BAO_TOKEN = env("EAI_BAO_TOKEN")
EAI_BAO_MOUNT = env("EAI_BAO_MOUNT", "secret")
EAI_BAO_LEASE_TTL = env("EAI_BAO_LEASE_TTL", "60s")
EAI_BAO_TIMEOUT_S = float(env("EAI_BAO_TIMEOUT_S", "2"))

# FinOps delivery (usage outbox) and metrics.
EAI_FINOPS_URL = env("EAI_FINOPS_URL")

# Sandboxed tools (SPEC §11): bubblewrap where installed, else off (503 and /readyz says why).
EAI_SANDBOX_RUNTIME = env("EAI_SANDBOX_RUNTIME") or "bwrap"
EAI_SANDBOX_ROOTS = env_list("EAI_SANDBOX_ROOTS")
EAI_SANDBOX_SLOTS = env_int("EAI_SANDBOX_SLOTS", 8)
EAI_SANDBOX_TENANT_SLOTS = env_int("EAI_SANDBOX_TENANT_SLOTS", 0)  # 0: half the slots
EAI_SANDBOX_MAX_MEMORY_MB = env_int("EAI_SANDBOX_MAX_MEMORY_MB", 1024)
EAI_SANDBOX_MAX_CPU_S = env_int("EAI_SANDBOX_MAX_CPU_S", 120)
EAI_SANDBOX_MAX_PROCESSES = env_int("EAI_SANDBOX_MAX_PROCESSES", 256)
EAI_SANDBOX_MAX_OUTPUT_BYTES = env_int("EAI_SANDBOX_MAX_OUTPUT_BYTES", 16 * 1024 * 1024)
EAI_SANDBOX_MAX_TMP_MB = env_int("EAI_SANDBOX_MAX_TMP_MB", 256)
# A memory cgroup per sandbox (the profile's memory bounds the whole tree): a directory the
# gateway may create cgroups in, `off`, or `auto` (as root on cgroup v1: its own).
EAI_SANDBOX_CGROUP = env("EAI_SANDBOX_CGROUP") or "auto"
EAI_METRICS_TOKEN = env("EAI_METRICS_TOKEN")
