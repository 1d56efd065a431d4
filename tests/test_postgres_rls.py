"""Row-level security on PostgreSQL: the database keeps tenants apart even from a
query that forgets to filter. Skipped on SQLite (which has no RLS)."""

import psycopg
import pytest
from django.db import connection
from psycopg import errors

from gateway.models import Invocation
from tenants import rls
from tenants.scope import TenantScopeError, tenant_scope

from .conftest import Api, error_of, tool_manifest

APP_ROLE = "eai_app"

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row-level security is PostgreSQL's"
)


@pytest.fixture
def app_role(transactional_db):
    """The app role (idempotently), granted on this test database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [APP_ROLE])
        if cursor.fetchone() is None:
            cursor.execute(
                f"CREATE ROLE {APP_ROLE} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE"
            )
        cursor.execute(
            f"GRANT CONNECT ON DATABASE {connection.settings_dict['NAME']} TO {APP_ROLE}"
        )
    rls.apply_row_level_security(connection)
    return APP_ROLE


def app_connection():
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["user"] = APP_ROLE
    params.pop("password", None)
    return psycopg.connect(**params)


@pytest.fixture
def two_tenants(app_role, alice, bob):
    alice.invoke("jira.search", {"q": "a"})
    bob.invoke("jira.search", {"q": "b"})
    return alice.key.tenant, bob.key.tenant


def test_the_app_role_cannot_bypass_and_owns_nothing(app_role):
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s", [APP_ROLE])
        assert cursor.fetchone() == (False, False)
        cursor.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
            "pg_get_userbyid(c.relowner) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'eai' AND c.relkind = 'r'"
        )
        tables = {
            name: (enabled, forced, owner) for name, enabled, forced, owner in cursor.fetchall()
        }
    assert "gateway_invocation" in tables  # the tables live in schema eai
    for table in rls.tenant_tables():
        enabled, forced, owner = tables[table]
        assert enabled and forced, table
        assert owner != APP_ROLE, table
    assert "tenants_apikey" not in rls.tenant_tables()


def test_a_raw_read_sees_only_the_tenant_set(two_tenants):
    tenant_a, tenant_b = two_tenants
    with app_connection() as conn:
        with conn.transaction():
            conn.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_a.id)])
            rows = conn.execute("SELECT DISTINCT tenant_id FROM gateway_invocation").fetchall()
        assert rows == [(tenant_a.id,)]
        with conn.transaction():  # no tenant set: nothing, never everything
            assert conn.execute("SELECT count(*) FROM gateway_invocation").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM gateway_auditevent").fetchone() == (0,)


def test_a_pooled_connection_moves_from_a_to_b(two_tenants):
    tenant_a, tenant_b = two_tenants
    with app_connection() as conn:
        for tenant in (tenant_a, tenant_b, tenant_a):
            with conn.transaction():
                conn.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant.id)])
                rows = conn.execute("SELECT DISTINCT tenant_id FROM gateway_decision").fetchall()
            assert rows == [(tenant.id,)]


def test_writing_another_tenants_row_fails_or_touches_nothing(two_tenants):
    tenant_a, tenant_b = two_tenants
    with tenant_scope(tenant_b, readonly=True):
        b_invocation = Invocation.objects.filter(tenant=tenant_b).first()
    with app_connection() as conn:
        with pytest.raises(errors.InsufficientPrivilege), conn.transaction():
            conn.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_a.id)])
            conn.execute(
                "INSERT INTO gateway_run (tenant_id, run_id, agent, status, created_at) "
                "VALUES (%s, 'run_x', '', 'running', now())",
                [tenant_b.id],
            )
        with conn.transaction():
            conn.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_a.id)])
            cursor = conn.execute(
                "UPDATE gateway_invocation SET status = 'cancelled' WHERE id = %s",
                [b_invocation.id],
            )
            assert cursor.rowcount == 0
    with tenant_scope(tenant_b, readonly=True):
        b_invocation.refresh_from_db()
    assert b_invocation.status == "succeeded"


def test_the_app_role_cannot_rewrite_the_audit_chain(two_tenants):
    tenant_a, _ = two_tenants
    with app_connection() as conn:
        for statement in (
            "UPDATE gateway_auditevent SET action = 'x'",
            "DELETE FROM gateway_auditevent",
        ):
            with pytest.raises(errors.InsufficientPrivilege), conn.transaction():
                conn.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_a.id)])
                conn.execute(statement)


@pytest.fixture
def as_app_role(app_role):
    """Serve the test's requests through a connection of the app role."""
    saved = connection.settings_dict["USER"]
    connection.close()
    connection.settings_dict["USER"] = APP_ROLE
    yield
    connection.close()
    connection.settings_dict["USER"] = saved


def test_the_gateway_works_end_to_end_as_the_app_role(alice, bob, upstream, as_app_role):
    """Every request path sets the tenant scope: under RLS, a path that forgot would see
    nothing and fail here."""
    manifest = tool_manifest(
        "echo", {"type": "http", "url": upstream.url("/echo")}, idempotent=True
    )
    assert alice.post("/v1/manifests/apply", manifest).status_code == 200
    body = alice.invoke("echo", {"x": 1}, run_id="run_rls").json()
    assert body["status"] == "succeeded"
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
    parked = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "2"}
    )
    assert parked.status_code == 202
    assert error_of(alice.invoke("secret.tool", {}))["code"] == "policy_denied"
    assert len(alice.get("/v1/tools").json()["results"]) == 4
    assert len(alice.get("/v1/tools/invocations").json()["results"]) == 4
    assert alice.get(f"/v1/decisions/{body['decision_id']}").status_code == 200
    assert alice.get("/v1/events", run_id="run_rls").json()["results"]
    assert alice.get("/v1/audit/verify").json()["valid"] is True
    assert (
        alice.post(f"/v1/tools/invocations/{parked.json()['invocation_id']}/cancel").status_code
        == 200
    )
    assert alice.post("/v1/runs", {"run_id": "run_rls2"}).status_code == 201
    assert alice.get("/v1/finops/usage").json()["results"]
    assert bob.get(f"/v1/tools/invocations/{body['invocation_id']}").status_code == 404
    assert bob.get("/v1/tools/invocations").json()["results"] == []
    assert Api(None).get("/readyz").status_code == 200


def test_a_scope_inside_a_transaction_gives_the_enclosing_tenant_back(alice, bob):
    """A transaction-local setting outlives a savepoint: without putting the enclosing
    one back, code after a nested scope would go on seeing that scope's rows."""
    tenant_a, tenant_b = alice.key.tenant, bob.key.tenant

    def setting() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('app.tenant_id', true)")
            return cursor.fetchone()[0] or ""

    from django.db import transaction

    with transaction.atomic():
        with tenant_scope(tenant_a):
            assert setting() == str(tenant_a.pk)
            # Another tenant's scope is refused inside one (tests/test_tenant_scope.py).
            with pytest.raises(TenantScopeError), tenant_scope(tenant_b, readonly=True):
                pass
            assert setting() == str(tenant_a.pk)
        assert setting() == ""  # nothing after the outer scope: no rows, never the last
        with pytest.raises(ZeroDivisionError), tenant_scope(tenant_b):
            raise ZeroDivisionError
        assert setting() == ""
