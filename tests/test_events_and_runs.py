"""Runs and the event feed of the agent tool protocol."""

import pytest

from tenants.scope import tenant_scope

from .conftest import error_of


def types(api, **params):
    return [e["type"] for e in api.get("/v1/events", limit=500, **params).json()["results"]]


def test_an_invoke_publishes_requested_started_completed(alice):
    body = alice.invoke("jira.search", {"q": "x"}, run_id="run_e1").json()
    events = alice.get("/v1/events", run_id="run_e1").json()["results"]
    assert [e["type"] for e in events] == [
        "agent.tool.requested",
        "agent.tool.started",
        "agent.tool.completed",
    ]
    for event in events:
        assert event["event_id"].startswith("evt_")
        assert event["invocation_id"] == body["invocation_id"]
        assert event["run_id"] == "run_e1"
        assert event["refs"]["decision_id"] == body["decision_id"]
        assert {"sequence", "type", "created_at", "payload", "refs"} <= set(event)
    assert events[-1]["payload"]["output"] == body["output"]


def test_a_denied_call_publishes_an_error(alice):
    alice.invoke("secret.tool", {}, run_id="run_e2")
    assert types(alice, run_id="run_e2") == ["agent.tool.requested", "agent.error"]


def test_a_parked_call_publishes_authorization_required(alice):
    alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1"}, run_id="run_e3"
    )
    assert types(alice, run_id="run_e3") == ["agent.tool.requested", "agent.authorization.required"]


def test_the_feed_is_strictly_increasing_and_pages_by_cursor(alice):
    for i in range(4):
        alice.invoke("jira.search", {"q": str(i)})
    seen, cursor = [], 0
    while True:
        page = alice.get("/v1/events", cursor=cursor, limit=5).json()
        if not page["results"]:
            assert page["next_cursor"] is None
            break
        seen += [e["sequence"] for e in page["results"]]
        assert page["next_cursor"] == str(page["results"][-1]["sequence"])
        cursor = page["next_cursor"]
    assert seen == list(range(1, 13))


@pytest.mark.parametrize("cursor", ["abc", "-1", "1.5"])
def test_it_refuses_a_bad_cursor(alice, cursor):
    response = alice.get("/v1/events", cursor=cursor)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_cursor"


def test_bob_sees_none_of_alices_events_or_runs(alice, bob):
    alice.invoke("jira.search", {"q": "x"}, run_id="run_alice")
    assert types(bob) == []
    assert bob.get("/v1/runs/run_alice").status_code == 404
    assert bob.post("/v1/runs/run_alice/resume").status_code == 404


def test_it_starts_reads_and_completes_a_run(alice):
    response = alice.post("/v1/runs", {"run_id": "run_turn1", "goal": "refund INC-42"})
    assert response.status_code == 201
    assert response.json()["run_id"] == "run_turn1"
    assert alice.post("/v1/runs", {"run_id": "run_turn1"}).status_code == 409
    alice.invoke("jira.search", {"q": "INC-42"}, run_id="run_turn1", step_index=0)
    parked = alice.invoke(
        "payments.transfer",
        {"iban": "FR7630006000011234567890189", "amount": "5"},
        run_id="run_turn1",
        step_index=1,
    ).json()
    state = alice.get("/v1/runs/run_turn1").json()
    assert state["status"] == "waiting"
    assert state["pending_invocations"] == [parked["invocation_id"]]
    # Still pending: resume publishes nothing yet.
    assert alice.post("/v1/runs/run_turn1/resume").json()["status"] == "waiting"
    alice.post(f"/v1/tools/invocations/{parked['invocation_id']}/cancel")
    resumed = alice.post("/v1/runs/run_turn1/resume").json()
    assert resumed["status"] == "completed"
    alice.post("/v1/runs/run_turn1/resume")
    assert types(alice, run_id="run_turn1").count("agent.turn.completed") == 1
    assert types(alice, run_id="run_turn1")[0] == "agent.turn.started"


def test_it_generates_a_run_id_when_none_is_given(alice):
    body = alice.post("/v1/runs", {}).json()
    assert body["run_id"].startswith("run_")


@pytest.mark.parametrize("body", [{"run_id": 5}, {"run_id": "has space"}, {"other": 1}, [1]])
def test_it_refuses_bad_run_bodies(alice, body):
    response = alice.post("/v1/runs", body)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_request"


def test_runs_and_events_need_their_scopes(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:read"])
    assert error_of(api.get("/v1/events"))["code"] == "insufficient_scope"
    assert error_of(api.post("/v1/runs", {}))["code"] == "insufficient_scope"


def test_a_large_payload_keeps_what_a_reader_needs(alice):
    from gateway.manifests import apply_manifests

    from .conftest import tool_manifest

    echo = tool_manifest("util.echo", {"type": "builtin", "callable": "echo"})
    apply_manifests(tenant=alice.key.tenant, documents=[echo])
    body = alice.invoke("util.echo", {"q": "A" * 20000}, run_id="run_big", step_index=2).json()
    events = alice.get("/v1/events", run_id="run_big").json()["results"]
    requested = events[0]["payload"]
    assert requested["tool"] == "util.echo" and requested["step_index"] == 2
    assert requested["truncated"] is True and requested["input"]["truncated"] is True
    assert requested["input"]["size_bytes"] > 20000
    completed = events[-1]["payload"]
    assert completed["status"] == body["status"] == "succeeded" and completed["cost"]


def test_a_runs_goal_is_masked_in_the_feed(alice):
    goal = "Pay FR7630006000011234567890189 card 4111111111111111 mail jean.dupont@example.fr"
    assert alice.post("/v1/runs", {"run_id": "run_goal", "goal": goal}).status_code == 201
    events = alice.get("/v1/events", run_id="run_goal").json()["results"]
    started = next(e for e in events if e["type"] == "agent.turn.started")
    shown = started["payload"]["goal"]
    assert (
        shown == "Pay FR76*******************0189 card 4111********1111 mail jean.******@*****le.fr"
    )


def test_a_call_made_into_a_completed_run_shows_it_waiting(alice):
    assert alice.post("/v1/runs", {"run_id": "run_again"}).status_code == 201
    assert alice.post("/v1/runs/run_again/resume").json()["status"] == "completed"
    parked = alice.invoke(
        "payments.transfer",
        {"iban": "FR7630006000011234567890189", "amount": "5"},
        run_id="run_again",
    ).json()
    state = alice.get("/v1/runs/run_again").json()
    assert state["status"] == "waiting"
    assert state["pending_invocations"] == [parked["invocation_id"]]


def test_a_resume_that_lost_the_race_answers_the_completed_run(alice):
    """The resume whose conditional update found the run already completed answered
    `running` with nothing pending."""
    from gateway.models import Run
    from gateway.runs import resume_run

    assert alice.post("/v1/runs", {"run_id": "run_race"}).status_code == 201
    with tenant_scope(alice.key.tenant, readonly=True):
        stale = Run.objects.get(tenant=alice.key.tenant, run_id="run_race")  # read before
    assert alice.post("/v1/runs/run_race/resume").json()["status"] == "completed"
    assert resume_run(key=alice.key, run=stale)["status"] == "completed"
    completed = [e for e in types(alice, run_id="run_race") if e == "agent.turn.completed"]
    assert len(completed) == 1
