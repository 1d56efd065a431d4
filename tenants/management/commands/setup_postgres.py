"""`manage.py setup_postgres`: create the PostgreSQL roles, database and schema.

Run once, with a superuser connection (`--admin-url`, default the EAI_DATABASE_URL in
force). It creates an owner role (runs migrations, owns the tables) and an app role
(serves requests and tasks: not superuser, not BYPASSRLS, owns nothing), the database
owned by the owner, the `eai` schema, and default privileges so that every table the
owner creates is readable and writable by the app role. Then migrate as the owner:

    EAI_DATABASE_URL=<app url> EAI_MIGRATE_DATABASE_URL=<owner url> \\
        python manage.py migrate --database migrate
"""

import os
from urllib.parse import quote, urlsplit

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from psycopg import sql


class Command(BaseCommand):
    help = "Create the owner and app roles, the database and the eai schema (PostgreSQL)."

    def add_arguments(self, parser):
        parser.add_argument("--admin-url", help="A superuser URL (default: EAI_DATABASE_URL).")
        parser.add_argument("--database-name", default="eai")
        parser.add_argument("--owner", default="eai_owner")
        parser.add_argument("--owner-password", default="")
        parser.add_argument("--app", default=settings.EAI_DB_APP_ROLE)
        parser.add_argument("--app-password", default="")

    def handle(self, *args, **options):
        admin_url = options["admin_url"] or os.environ.get("EAI_DATABASE_URL", "")
        if not admin_url:
            raise CommandError("Give --admin-url postgres://superuser@host:5432/postgres")
        owner, app, name = options["owner"], options["app"], options["database_name"]
        schema = settings.EAI_DB_SCHEMA
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role, password, extra in (
                (owner, options["owner_password"], "NOSUPERUSER NOBYPASSRLS NOCREATEROLE"),
                (app, options["app_password"], "NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB"),
            ):
                exists = conn.execute(
                    "SELECT 1 FROM pg_roles WHERE rolname = %s", [role]
                ).fetchone()
                verb = "ALTER" if exists else "CREATE"
                statement = sql.SQL(verb + " ROLE {} LOGIN " + extra).format(sql.Identifier(role))
                if password:
                    statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(password))
                conn.execute(statement)
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(name), sql.Identifier(owner)
                    )
                )
        parts = urlsplit(admin_url)
        db_url = parts._replace(path="/" + quote(name)).geturl()
        with psycopg.connect(db_url, autocommit=True) as conn:
            ids = {
                "schema": sql.Identifier(schema),
                "owner": sql.Identifier(owner),
                "app": sql.Identifier(app),
                "db": sql.Identifier(name),
            }
            for statement in (
                "CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {owner}",
                "REVOKE ALL ON DATABASE {db} FROM PUBLIC",
                "GRANT CONNECT ON DATABASE {db} TO {app}",
                "GRANT CONNECT, CREATE ON DATABASE {db} TO {owner}",
                "GRANT USAGE ON SCHEMA {schema} TO {app}",
                "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} "
                "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app}",
                "ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} "
                "GRANT USAGE, SELECT ON SEQUENCES TO {app}",
            ):
                conn.execute(sql.SQL(statement).format(**ids))
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 5432

        def url(role: str, password: str) -> str:
            # The password is never printed: this output ends up in deployment logs.
            auth = f"{role}:…" if password else role
            return f"postgres://{auth}@{host}:{port}/{name}"

        self.stdout.write("Roles, database and schema are ready. Then:")
        self.stdout.write(f"  EAI_MIGRATE_DATABASE_URL={url(owner, options['owner_password'])}")
        self.stdout.write(f"  EAI_DATABASE_URL={url(app, options['app_password'])}")
        self.stdout.write("  python manage.py migrate --database migrate")
