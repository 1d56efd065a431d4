"""The shared behaviours of sdk/scenarios.json, run by the synchronous client and by the
asynchronous one against the live gateway."""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
from typing import Any

import pytest
from enterprise_ai import (
    AsyncEnterpriseAI,
    EnterpriseAI,
    EnterpriseAIError,
    RateLimitError,
)

SCENARIO_IDS = [
    s["id"]
    for s in json.loads(
        (__import__("pathlib").Path(__file__).parents[2] / "scenarios.json").read_text()
    )["scenarios"]
]


class Runner:
    """Calls the client whatever its kind: awaits what the async client returns."""

    def __init__(self, kind: str, gateway: dict[str, Any]) -> None:
        self.kind, self.gateway = kind, gateway
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self.clients: list[Any] = []

    def client(self, key: str, **options: Any) -> Any:
        cls = AsyncEnterpriseAI if self.kind == "async" else EnterpriseAI
        client = cls(
            base_url=self.gateway["base_url"], api_key=self.gateway["keys"][key], **options
        )
        self.clients.append(client)
        return client

    def __call__(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            return self.loop.run_until_complete(value)
        return value

    def rows(self, iterator: Any) -> list[Any]:
        if hasattr(iterator, "__aiter__"):

            async def collect() -> list[Any]:
                return [row async for row in iterator]

            return self.loop.run_until_complete(collect())
        return list(iterator)

    def close(self) -> None:
        for client in self.clients:
            self(client.aclose() if self.kind == "async" else client.close())
        if self.loop:
            self.loop.close()


def fill(text: str, nonce: str) -> str:
    return text.replace("{lang}", "python").replace("{nonce}", nonce)


def check_error(exc: EnterpriseAIError, want: dict[str, Any]) -> None:
    if "status" in want:
        assert exc.status == want["status"], exc
    if "code" in want:
        assert exc.code == want["code"], exc
    if "decision_id_prefix" in want:
        assert (exc.decision_id or "").startswith(want["decision_id_prefix"])
    if "request_id_prefix" in want:
        assert (exc.request_id or "").startswith(want["request_id_prefix"])
    if "message_contains" in want:
        assert want["message_contains"] in exc.message
    if "message_i18n_en_contains" in want:
        assert want["message_i18n_en_contains"] in exc.message_i18n["en"]
    assert set(exc.message_i18n) >= {"en", "fr"}


def invoke_masks_iban(run: Runner, s: dict[str, Any]) -> None:
    inv = run(
        run.client(s["key"]).tools.invoke(
            s["tool"], s["input"], run_id=fill(s["run_id"], secrets.token_hex(4))
        )
    )
    assert inv["status"] == s["expect"]["status"]
    assert inv["invocation_id"].startswith(s["expect"]["invocation_id_prefix"])
    assert s["expect"]["output_contains"] in json.dumps(inv["output"])
    assert s["expect"]["output_not_contains"] not in json.dumps(inv)


def refused(run: Runner, s: dict[str, Any], **options: Any) -> None:
    with pytest.raises(EnterpriseAIError) as caught:
        run(run.client(s["key"], **options).tools.invoke(s["tool"], s["input"]))
    check_error(caught.value, s["expect_error"])


def parked_then_wait(run: Runner, s: dict[str, Any]) -> None:
    agent = run.client(s["key"])
    parked = run(agent.tools.invoke(s["tool"], arguments=s["input"]))
    assert parked["status"] == s["expect"]["status"]
    assert parked["approval_id"].startswith(s["expect"]["approval_id_prefix"])
    approve = s["approve"]
    run(
        run.client(approve["key"]).approvals.decide(
            parked["approval_id"], approve["verdict"], approve["reason"]
        )
    )
    final = run(agent.invocations.wait(parked["invocation_id"], timeout=s["wait_seconds"]))
    assert final["status"] == s["expect_after_wait"]["status"]


def idempotent_replay_and_conflict(run: Runner, s: dict[str, Any]) -> None:
    client = run.client(s["key"])
    key = fill(s["idempotency_key"], secrets.token_hex(6))
    first = run(client.tools.invoke(s["tool"], s["input"], idempotency_key=key))
    again = run(client.tools.invoke(s["tool"], s["input"], idempotency_key=key))
    assert again["invocation_id"] == first["invocation_id"]
    with pytest.raises(EnterpriseAIError) as caught:
        run(client.tools.invoke(s["tool"], s["conflict_input"], idempotency_key=key))
    check_error(caught.value, s["expect_error_on_conflict"])


def rate_limited_then_success(run: Runner, s: dict[str, Any]) -> None:
    no_retry = run.client(s["key"], max_retries=0)
    limited = None
    for _ in range(3):
        try:
            run(no_retry.tools.invoke(s["tool"], s["input"]))
        except RateLimitError as exc:
            limited = exc
            break
    assert limited is not None, "three calls in a row were never rate limited"
    check_error(limited, s["expect_error_without_retry"])
    assert limited.retry_after >= s["expect_error_without_retry"]["retry_after_min_seconds"]
    retrying = run.client(s["key"], max_retries=3)
    for _ in range(2):
        inv = run(retrying.tools.invoke(s["tool"], s["input"]))
        assert inv["status"] == s["expect_with_retry"]["status"]


def pagination(run: Runner, s: dict[str, Any]) -> None:
    client = run.client(s["key"])
    run_id = fill(s["run_id"], secrets.token_hex(4))
    made = {
        run(client.tools.invoke(s["tool"], s["input"], run_id=run_id, step_index=i))[
            "invocation_id"
        ]
        for i in range(s["calls"])
    }
    pages, cursor = 0, None
    while True:
        page = run(client.invocations.list(run_id=run_id, limit=s["page_size"], cursor=cursor))
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    rows = run.rows(client.invocations.iter(run_id=run_id, limit=s["page_size"]))
    ids = [row["invocation_id"] for row in rows]
    assert len(ids) == len(set(ids)) == s["expect"]["count"]
    assert set(ids) == made
    assert pages >= s["expect"]["min_pages"]


def french_message(run: Runner, s: dict[str, Any]) -> None:
    refused(run, s, language=s["language"])


def cross_tenant_not_found(run: Runner, s: dict[str, Any]) -> None:
    inv = run(run.client(s["key"]).tools.invoke(s["tool"], s["input"]))
    with pytest.raises(EnterpriseAIError) as caught:
        run(run.client(s["other_key"]).invocations.get(inv["invocation_id"]))
    check_error(caught.value, s["expect_error"])


RUNNERS = {
    "invoke_masks_iban": invoke_masks_iban,
    "policy_denied": refused,
    "tool_not_found": refused,
    "parked_then_wait": parked_then_wait,
    "idempotent_replay_and_conflict": idempotent_replay_and_conflict,
    "rate_limited_then_success": rate_limited_then_success,
    "pagination": pagination,
    "french_message": french_message,
    "cross_tenant_not_found": cross_tenant_not_found,
}


def test_every_scenario_is_implemented() -> None:
    assert set(SCENARIO_IDS) <= set(RUNNERS), set(SCENARIO_IDS) - set(RUNNERS)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("scenario_id", SCENARIO_IDS)
def test_scenario(gateway: dict[str, Any], kind: str, scenario_id: str) -> None:
    scenario = next(s for s in gateway["scenario_list"] if s["id"] == scenario_id)
    run = Runner(kind, gateway)
    try:
        RUNNERS[scenario_id](run, scenario)
    finally:
        run.close()
