"""Celery for real: a worker process on a Redis broker runs queued calls; a worker
killed mid-call loses no call and never repeats a non-idempotent side effect."""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test import override_settings

from eai.celery import app as celery_app
from gateway import pipeline
from gateway.manifests import apply_manifests
from gateway.models import Invocation
from tenants.scope import tenant_scope

from .conftest import tool_manifest

BROKER = "redis://127.0.0.1:6379/14"


def _redis_up() -> bool:
    try:
        return bool(redis.Redis.from_url(BROKER, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not _redis_up(), reason="no Redis on 127.0.0.1:6379"),
]


def _worker_env() -> dict[str, str]:
    env = {**os.environ, "EAI_BROKER_URL": BROKER, "EAI_REDIS_URL": ""}
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
        env["EAI_DATABASE_URL"] = (
            f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    else:
        env.pop("EAI_DATABASE_URL", None)
        env["EAI_SQLITE_PATH"] = db["NAME"]
    return env


class Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "eai",
                "worker",
                "-P",
                "threads",
                "-c",
                "2",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
            cwd=settings.BASE_DIR,
            env=_worker_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        for line in self.proc.stderr:
            if "ready." in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the Celery worker did not start")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def broker():
    redis.Redis.from_url(BROKER).flushdb()
    celery_app.conf.broker_url = BROKER
    with override_settings(EAI_BROKER_URL=BROKER):
        yield
    redis.Redis.from_url(BROKER).flushdb()


@pytest.fixture
def worker(broker):
    started = Worker()
    yield started
    started.stop()


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_worker_runs_an_async_call(alice, worker):
    response = alice.invoke("jira.search", {"q": "INC-5"}, headers={"Prefer": "respond-async"})
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    got = alice.get(f"/v1/tools/invocations/{body['invocation_id']}", wait=20).json()
    assert got["status"] == "succeeded" and got["output"]["issues"][0]["key"] == "INC-5"


def test_a_worker_killed_mid_call_repeats_no_side_effect(alice, upstream, broker):
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest(
                "bank.wire",
                {"type": "http", "url": upstream.url("/slow?s=5"), "timeout_ms": 8000},
                idempotent=False,
            )
        ],
    )
    first = Worker()
    try:
        body = alice.invoke("bank.wire", {"n": 1}, headers={"Prefer": "respond-async"}).json()
        assert wait_for(lambda: any(c["path"] == "/slow" for c in upstream.calls))
        first.kill()  # kill -9 while the upstream call is in flight
    finally:
        first.stop()
    with tenant_scope(alice.key.tenant, readonly=True):
        invocation = Invocation.objects.get(pk=body["invocation_id"])
    assert invocation.status == "running"
    # A redelivered message finds it claimed and runs nothing.
    assert pipeline.execute_queued(invocation.id, alice.key.tenant) is None
    # Too early: still within its timeout, it is left alone.
    assert pipeline.recover_stuck(alice.key.tenant, grace_s=0) == 0
    with tenant_scope(alice.key.tenant):
        Invocation.objects.filter(pk=invocation.pk).update(
            started_at=invocation.started_at - timedelta(seconds=60)
        )
    assert pipeline.recover_stuck(alice.key.tenant, grace_s=0) == 1
    with tenant_scope(alice.key.tenant, readonly=True):
        invocation.refresh_from_db()
    assert invocation.status == "failed" and invocation.error["code"] == "worker_lost"
    assert invocation.sealed_input is None
    assert len([c for c in upstream.calls if c["path"] == "/slow"]) == 1
    assert pipeline.recover_stuck(alice.key.tenant, grace_s=0) == 0


def status_of(tenant, invocation_id):
    with tenant_scope(tenant, readonly=True):
        return Invocation.objects.get(pk=invocation_id).status


def test_an_idempotent_call_lost_with_its_worker_runs_again(alice, upstream, broker):
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            tool_manifest(
                "crm.read",
                {"type": "http", "url": upstream.url("/slow?s=5"), "timeout_ms": 8000},
                idempotent=True,
            )
        ],
    )
    first = Worker()
    try:
        body = alice.invoke("crm.read", {"n": 1}, headers={"Prefer": "respond-async"}).json()
        assert wait_for(lambda: any(c["path"] == "/slow" for c in upstream.calls))
        first.kill()
    finally:
        first.stop()

    with tenant_scope(alice.key.tenant):
        Invocation.objects.filter(pk=body["invocation_id"]).update(
            started_at=Invocation.objects.get(pk=body["invocation_id"]).started_at
            - timedelta(seconds=60)
        )
    second = Worker()
    try:
        assert pipeline.recover_stuck(alice.key.tenant, grace_s=0) == 1
        assert wait_for(
            lambda: status_of(alice.key.tenant, body["invocation_id"]) == "succeeded", 30
        )
    finally:
        second.stop()


@pytest.fixture
def dead_broker():
    """A broker URL nothing listens on, with Celery's cached connections dropped (as a
    fork drops them), so that the next send really connects."""
    dead, before = "redis://127.0.0.1:1/0", celery_app.conf.broker_url

    def reset(url):
        celery_app.conf.broker_url = url
        celery_app._pool = None
        celery_app.amqp._producer_pool = None

    reset(dead)
    try:
        with override_settings(EAI_BROKER_URL=dead):
            yield
    finally:
        reset(before)


def test_a_call_whose_broker_is_down_runs_in_the_process(alice, dead_broker):
    """It was committed `queued`, then the send failed: the answer was a 500 and the
    call stayed queued for good. Now the 202 stands and this process runs it."""
    response = alice.invoke("jira.search", {"q": "INC-7"}, headers={"Prefer": "respond-async"})
    assert response.status_code == 202, response.content
    invocation_id = response.json()["invocation_id"]
    got = alice.get(f"/v1/tools/invocations/{invocation_id}", wait=20).json()
    assert got["status"] == "succeeded" and got["output"]["issues"][0]["key"] == "INC-7"
