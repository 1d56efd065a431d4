"""The tenant scope fails closed: tenant-owned models answer nothing outside a scope,
only the scope's tenant's rows inside one, and `unscoped()` is the one way round it.

Personas: Alice's acme and Bob's globex, each with the same seeded tools."""

import pytest
from django.apps import apps
from django.db import connection

from gateway.models import Decision, Invocation, TenantOwned, Tool
from tenants import rls
from tenants.models import Tenant
from tenants.scope import TenantScopeError, current_tenant, tenant_scope, tenant_session

from .conftest import scope

TENANT_OWNED = [m for m in apps.get_models() if issubclass(m, TenantOwned)]


def test_every_model_with_a_tenant_is_tenant_owned():
    """The set the database guards (row-level security) is the set the managers guard."""
    assert sorted(m._meta.db_table for m in TENANT_OWNED) == rls.tenant_tables()


@pytest.mark.parametrize("model", TENANT_OWNED, ids=lambda m: m.__name__)
def test_it_refuses_every_query_outside_a_scope(db, model):
    assert current_tenant() is None
    for query in (
        lambda: list(model.objects.all()),
        lambda: model.objects.filter(pk=1).exists(),
        lambda: model.objects.count(),
        lambda: model.objects.none(),
        lambda: model.objects.filter(pk=1).update(),
        lambda: model.objects.filter(pk=1).delete(),
    ):
        with pytest.raises(TenantScopeError, match="outside a tenant scope"):
            query()


def test_it_shows_a_scope_its_own_tenants_rows_and_no_others(tenant_a, tenant_b):
    with scope(tenant_a):
        tools = list(Tool.objects.all())
        assert tools and {t.tenant_id for t in tools} == {tenant_a.pk}
        # A filter naming the other tenant finds nothing: the scope's filter still holds.
        assert not Tool.objects.filter(tenant=tenant_b).exists()
        assert not Tool.objects.filter(tenant_id=tenant_b.pk).exists()
        assert Tool.objects.for_tenant(tenant_a).count() == len(tools)
        with pytest.raises(TenantScopeError):
            Tool.objects.for_tenant(tenant_b)
        # Related managers are filtered too: a tenant's reverse relation included.
        assert not tenant_b.tools.exists()


def test_it_refuses_to_write_a_row_outside_its_tenants_scope(tenant_a, tenant_b):
    with scope(tenant_b):
        theirs = Tool.objects.get(name="jira.search")
    theirs.disabled = True
    with pytest.raises(TenantScopeError):
        theirs.save()
    with scope(tenant_a), pytest.raises(TenantScopeError):
        theirs.save()
    with scope(tenant_a), pytest.raises(TenantScopeError):
        theirs.delete()
    with scope(tenant_a), pytest.raises(TenantScopeError):
        Tool.objects.create(tenant=tenant_b, name="x", version="1", manifest={}, digest="d")
    clone = Tool(tenant=tenant_b, name="y", version="1", manifest={}, digest="d")
    with scope(tenant_a), pytest.raises(TenantScopeError):
        Tool.objects.bulk_create([clone])
    with scope(tenant_a):  # nor can a row of A be handed to B
        with pytest.raises(TenantScopeError):
            Tool.objects.filter(name="secret.tool").update(tenant=tenant_b)
        with pytest.raises(TenantScopeError):
            Tool.objects.filter(name="secret.tool").update(tenant_id=tenant_b.pk)
        assert Tool.objects.filter(name="secret.tool").update(tenant=tenant_a) == 1
    with scope(tenant_b):
        assert Tool.objects.get(name="jira.search").disabled is False
        assert not Tool.objects.filter(name__in=["x", "y"]).exists()


def test_it_refuses_to_enter_another_tenants_scope_inside_one(tenant_a, tenant_b):
    with tenant_scope(tenant_a):
        with pytest.raises(TenantScopeError, match="cannot be entered"), tenant_scope(tenant_b):
            pass
        with pytest.raises(TenantScopeError), tenant_session(tenant_b):
            pass
        with tenant_scope(tenant_a):  # the same tenant nests (a domain function's own)
            assert current_tenant() == tenant_a
        assert current_tenant() == tenant_a
    assert current_tenant() is None


def test_a_scope_ends_with_its_block_even_on_an_error(tenant_a):
    with pytest.raises(RuntimeError), tenant_session(tenant_a):
        raise RuntimeError("boom")
    assert current_tenant() is None
    with pytest.raises(TenantScopeError):
        Tool.objects.count()


def test_unscoped_is_the_one_way_across_tenants(tenant_a, tenant_b):
    if connection.vendor == "postgresql" and not _bypasses_rls():
        # Under row-level security (CI's role) the database itself still keeps the
        # tenants apart: unscoped() lifts the ORM's guard, never PostgreSQL's.
        assert not Tool.objects.unscoped().filter(name="jira.search").exists()
        return
    rows = Tool.objects.unscoped().filter(name="jira.search")
    assert {t.tenant_id for t in rows} == {tenant_a.pk, tenant_b.pk}
    with scope(tenant_a):  # it says what it does, whatever scope is active
        assert Tool.objects.unscoped().filter(name="jira.search").count() == 2


def _bypasses_rls() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        return bool(cursor.fetchone()[0])


@pytest.mark.skipif(
    connection.vendor == "postgresql",
    reason="a tenant made and deleted in one test transaction under row-level security: "
    "covered on SQLite; the PostgreSQL cascade is tested in test_postgres_rls",
)
def test_foreign_keys_and_cascades_use_the_plain_base_manager(alice, tenant_b):
    """A row already read reaches its relations without a scope; a tenant's deletion
    takes its rows along (the platform's admin deletes tenants, outside any scope)."""
    body = alice.invoke("jira.search", {"q": "x"}).json()
    with scope(alice.key.tenant):
        invocation = Invocation.objects.get(pk=body["invocation_id"])
    assert isinstance(invocation.decision, Decision)
    doomed = Tenant.objects.create(slug="doomed", name="Doomed")
    with scope(doomed):
        Tool.objects.create(tenant=doomed, name="t", version="1", manifest={}, digest="d")
    doomed.delete()
    assert not Tool.objects.unscoped().filter(tenant_id=doomed.pk).exists()


def test_an_api_request_is_bound_to_its_keys_tenant_and_unbound_after(alice, bob):
    seen = []

    def spy(*args, **kwargs):
        seen.append(current_tenant())

    from gateway import views

    original = views.ToolListView.catalog_entry
    views.ToolListView.catalog_entry = lambda self, tool: (spy(), original(self, tool))[1]
    try:
        assert alice.get("/v1/tools").status_code == 200
        assert bob.get("/v1/tools").status_code == 200
    finally:
        views.ToolListView.catalog_entry = original
    assert {t.slug for t in seen} == {"acme", "globex"}
    assert current_tenant() is None
    assert alice.get("/v1/tools/invocations/tinv_nope").status_code == 404
    assert current_tenant() is None  # an error ends the request's scope too


# ------------------------------------------------------------------ PostgreSQL


pg_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's setting")


def app_setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('app.tenant_id', true)")
        return cursor.fetchone()[0] or ""


@pg_only
def test_the_tenant_session_sets_the_setting_for_its_span_only(alice):
    tenant = alice.key.tenant
    with tenant_session(tenant):
        assert app_setting() == str(tenant.pk)
        with tenant_scope(tenant):
            assert app_setting() == str(tenant.pk)
        assert app_setting() == str(tenant.pk)
    assert app_setting() == ""
    assert alice.get("/v1/tools").status_code == 200
    assert app_setting() == ""
    assert alice.get("/v1/runs/none-such").status_code == 404
    assert app_setting() == ""


@pg_only
def test_rows_read_outside_a_transaction_are_the_scopes_alone_under_rls(
    transactional_db, alice, bob
):
    """As the app role (row-level security applies), a raw query outside any
    transaction inside a request's scope sees only that tenant's rows; after it, none."""
    from tests.test_postgres_rls import APP_ROLE, app_role  # noqa: F401 - the fixture's role

    alice.invoke("jira.search", {"q": "a"})
    bob.invoke("jira.search", {"q": "b"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [APP_ROLE])
        if cursor.fetchone() is None:
            pytest.skip("no app role on this server")
        # SET ROLE needs membership: a CREATEROLE user (CI's) administers the role it
        # made but is not a member of it until it says so.
        cursor.execute(f"GRANT {APP_ROLE} TO CURRENT_USER")
    rls.apply_row_level_security(connection)

    def tenants_seen() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SET ROLE " + APP_ROLE)
            try:
                cursor.execute("SELECT DISTINCT tenant_id::text FROM gateway_invocation")
                return {row[0] for row in cursor.fetchall()}
            finally:
                cursor.execute("RESET ROLE")

    with tenant_session(alice.key.tenant):
        assert tenants_seen() == {str(alice.key.tenant.pk)}
    assert tenants_seen() == set()


def test_the_admin_shows_staff_without_a_tenant_empty_lists(db, client):
    """No tenant to work in (a fresh platform): the admin's lists are empty, not errors
    of a query run outside any scope."""
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", password="pw-rootroot")
    client.force_login(admin)
    for model in ("invocation", "tool", "decision", "auditevent", "approvalrequest"):
        assert client.get(f"/admin/gateway/{model}/").status_code == 200, model


def test_the_periodic_tasks_enter_each_tenants_scope(alice, bob):
    """Beat runs them outside any request: each enters tenant after tenant, and none
    is left bound after it."""
    from approvals.tasks import expire_approvals
    from gateway import tasks

    alice.invoke("jira.search", {"q": "a"}, headers={"Idempotency-Key": "k"})
    bob.invoke("jira.search", {"q": "b"}, headers={"Idempotency-Key": "k"})
    assert expire_approvals() == 0
    assert tasks.purge_idempotency() == 0
    assert tasks.recover_stuck() == 0
    assert tasks.write_checkpoints() == 2
    assert tasks.deliver_usage() == 0
    assert current_tenant() is None


@pg_only
def test_a_session_whose_setting_cannot_be_emptied_is_closed_not_reused(transactional_db):
    """The server connection dies mid-request: emptying the setting fails, and the
    connection is dropped rather than handed on with the tenant's setting."""
    tenant = Tenant.objects.create(slug="lost", name="Lost")
    with tenant_session(tenant):
        assert app_setting() == str(tenant.pk)
        connection.connection.close()
    assert connection.connection is None
    assert app_setting() == ""
    assert current_tenant() is None
