#!/bin/sh
# The image's roles. Server settings come from the environment:
#   EAI_BIND (0.0.0.0:8000), EAI_WEB_WORKERS (2), EAI_WEB_TIMEOUT (120 s, above the slowest
#   tool's timeout_ms), EAI_WORKER_CONCURRENCY (2); GUNICORN_CMD_ARGS adds any gunicorn flag.
set -eu
role="${1:-api}"
[ "$#" -gt 0 ] && shift
manage() { exec python3 /app/manage.py "$@"; }
case "$role" in
  api)
    if [ -n "${EAI_BROKER_URL:-${EAI_REDIS_URL:-}}" ]; then
      # Several processes: shared state lives in Redis, queued calls go to the workers.
      exec gunicorn eai.wsgi -k eai.workers.InlineWorker \
        -w "${EAI_WEB_WORKERS:-2}" -b "${EAI_BIND:-0.0.0.0:8000}" \
        --timeout "${EAI_WEB_TIMEOUT:-120}" --access-logfile - \
        --worker-tmp-dir /tmp "$@"
    fi
    # No broker: one process whose threads run queued calls and the periodic jobs, so the
    # in-memory fallbacks stay exact (run one replica).
    manage serve --no-upstream --bind "${EAI_BIND:-0.0.0.0:8000}" "$@" ;;
  worker)
    exec celery -A eai worker -l INFO -c "${EAI_WORKER_CONCURRENCY:-2}" "$@" ;;
  beat)
    exec celery -A eai beat -l INFO -s /tmp/celerybeat-schedule "$@" ;;
  migrate)
    # As the owner role when EAI_MIGRATE_DATABASE_URL is set (row-level security and the
    # app role's grants are applied by the migrations).
    if [ -n "${EAI_MIGRATE_DATABASE_URL:-}" ]; then manage migrate --database migrate --noinput "$@"; fi
    manage migrate --noinput "$@" ;;
  setup-database)
    # The bundled database: create the owner and app roles (idempotent), then migrate.
    : "${EAI_DB_ADMIN_URL:?EAI_DB_ADMIN_URL (a superuser URL) is required}"
    i=0
    until python3 -c "import os,psycopg; psycopg.connect(os.environ['EAI_DB_ADMIN_URL'], connect_timeout=3).close()" 2>/dev/null; do
      i=$((i + 1)); [ "$i" -ge 60 ] && { echo "the database did not answer in 3 minutes" >&2; exit 1; }
      sleep 3
    done
    python3 /app/manage.py setup_postgres --admin-url "$EAI_DB_ADMIN_URL" \
      --database-name "${EAI_DB_NAME:-eai}" --owner "${EAI_DB_OWNER_ROLE:-eai_owner}" \
      --owner-password "${EAI_DB_OWNER_PASSWORD:-}" --app "${EAI_DB_APP_ROLE:-eai_app}" \
      --app-password "${EAI_DB_APP_PASSWORD:-}"
    manage migrate --database migrate --noinput "$@" ;;
  manage)
    manage "$@" ;;
  *)
    manage "$role" "$@" ;;
esac
