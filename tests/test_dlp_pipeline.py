"""DLP through the pipeline: what is stored, returned, sent, evented and audited."""

import json

import pytest

from gateway.manifests import apply_manifests
from gateway.models import AuditEvent, Event, Invocation
from tenants.scope import tenant_scope

from .conftest import error_of, scope, tool_manifest

IBAN = "FR7630006000011234567890189"
MASKED_IBAN = "FR76*******************0189"
EMAIL = "camille.martin@example.fr"


def add_http(api, name, url, **spec):
    apply_manifests(
        tenant=api.key.tenant,
        documents=[tool_manifest(name, {"type": "http", "url": url}, idempotent=True, **spec)],
    )


def test_an_iban_in_the_output_comes_back_masked_everywhere(alice):
    """Seed test 2: masked in the answer, the stored invocation, the events and audit."""
    body = alice.invoke("jira.search", {"q": "INC-42"}, run_id="run_d").json()
    text = body["output"]["issues"][0]["description"]
    assert MASKED_IBAN in text and IBAN not in json.dumps(body)
    assert body["redactions"] == [{"entity": "IBAN", "count": 1, "where": "output"}]
    assert alice.get(f"/v1/tools/invocations/{body['invocation_id']}").json() == body
    with tenant_scope(alice.key.tenant, readonly=True):
        stored = Invocation.objects.get(pk=body["invocation_id"])
        events, entries = list(Event.objects.all()), list(AuditEvent.objects.all())
        redact = AuditEvent.objects.get(action="dlp.redact")
    assert IBAN not in json.dumps(stored.output)
    assert len(events) == 3 and len(entries) >= 3
    for event in events:
        assert IBAN not in json.dumps(event.payload)
    for entry in entries:
        assert IBAN not in entry.canonical
    payload = json.loads(redact.canonical)["payload"]
    assert payload["entities"] == {"IBAN": 1} and payload["where"] == "output"


def test_the_input_is_stored_and_sent_masked_by_default(alice, upstream):
    add_http(alice, "crm.note", upstream.url("/echo"))
    body = alice.invoke("crm.note", {"text": f"write to {EMAIL}", "tool": "mailer.send"}).json()
    assert EMAIL not in json.dumps(body)
    assert body["input"]["tool"] == "mailer.send"  # dotted names are never altered
    sent = json.loads(upstream.calls[-1]["body"])
    assert EMAIL not in sent["text"] and sent["tool"] == "mailer.send"
    assert {"entity": "EMAIL", "count": 1, "where": "input"} in body["redactions"]
    assert {"entity": "EMAIL", "count": 1, "where": "output"} not in body[
        "redactions"
    ]  # masked going in


def test_allow_sends_the_real_value_but_stores_it_masked(alice, upstream):
    add_http(alice, "bank.pay", upstream.url("/echo"), dlp={"input": "allow"})
    body = alice.invoke("bank.pay", {"iban": IBAN}).json()
    assert json.loads(upstream.calls[-1]["body"])["iban"] == IBAN
    assert body["input"]["iban"] == MASKED_IBAN
    assert body["output"]["got"]["iban"] == MASKED_IBAN  # the echo is masked on the way out


def test_block_refuses_a_call_carrying_a_finding_and_sends_nothing(alice, upstream):
    add_http(alice, "strict", upstream.url("/echo"), dlp={"input": "block"})
    response = alice.invoke("strict", {"note": f"IBAN {IBAN}"}, headers={"Accept-Language": "fr"})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "dlp_blocked"
    assert error["details"] == {"entities": ["IBAN"], "where": "input"}
    assert "IBAN" in error["message"] and IBAN not in json.dumps(response.json())
    assert error["message"] == error["message_i18n"]["fr"]
    assert upstream.calls == []
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=error["invocation_id"])
    assert stored.status == "denied" and IBAN not in json.dumps(stored.input)
    assert alice.invoke("strict", {"note": "nothing personal"}).status_code == 200


def test_block_on_output_denies_the_answer(alice, upstream):
    add_http(alice, "leaky", upstream.url("/echo"), dlp={"input": "allow", "output": "block"})
    assert alice.invoke("leaky", {"note": "call me"}).status_code == 200
    response = alice.invoke("leaky", {"iban": IBAN})  # sent raw, echoed back raw
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "dlp_blocked" and error["details"]["where"] == "output"
    with scope(alice.key.tenant):
        stored = Invocation.objects.get(pk=error["invocation_id"])
    # SPEC §2: `denied` answers 403 (a `failed` call answers 502).
    assert stored.status == "denied" and stored.output is None
    assert IBAN not in response.content.decode()


def test_redact_uses_typed_placeholders(alice, upstream):
    add_http(alice, "redacting", upstream.url("/echo"), dlp={"input": "redact", "output": "redact"})
    body = alice.invoke("redacting", {"iban": IBAN, "mail": EMAIL}).json()
    assert body["input"] == {"iban": "[IBAN]", "mail": "[EMAIL]"}


def test_entities_limit_what_is_scrubbed(alice, upstream):
    add_http(alice, "ibans.only", upstream.url("/echo"), dlp={"entities": ["IBAN"]})
    body = alice.invoke("ibans.only", {"iban": IBAN, "mail": EMAIL}).json()
    assert body["input"] == {"iban": MASKED_IBAN, "mail": EMAIL}


def test_validation_messages_do_not_echo_personal_data(alice):
    response = alice.invoke("jira.search", {"q": [IBAN]})
    assert response.status_code == 400
    assert IBAN not in response.content.decode()
    assert MASKED_IBAN in response.content.decode()


POLICY = """package eai.tool

import rego.v1

obligations contains {"type": "dlp", "action": "block", "entities": ["EMAIL"]} if {
\tinput.tool.name == "crm.note"
}

obligations contains {"type": "redact_fields", "fields": ["password"]} if {
\tinput.tool.name == "crm.note"
}
"""


def test_policy_obligations_tighten_dlp(alice, upstream):
    add_http(alice, "crm.note", upstream.url("/echo"))
    apply_manifests(
        tenant=alice.key.tenant,
        documents=[
            {
                "apiVersion": "eai/v1",
                "kind": "Policy",
                "metadata": {"name": "dlp-tight", "version": "1"},
                "spec": {"rego": POLICY},
            }
        ],
    )
    response = alice.invoke("crm.note", {"text": EMAIL})
    assert error_of(response)["code"] == "dlp_blocked"
    body = alice.invoke("crm.note", {"text": "hello", "password": "hunter2"}).json()
    assert body["input"]["password"] == "[REDACTED]"


@pytest.mark.django_db(transaction=True)
def test_a_parked_call_keeps_its_raw_input_sealed_until_it_runs(alice):
    from django.db import connection

    body = alice.invoke("payments.transfer", {"iban": IBAN, "amount": "3"}).json()
    assert body["input"]["iban"] == MASKED_IBAN
    from tenants.scope import tenant_scope

    with tenant_scope(alice.key.tenant, readonly=True), connection.cursor() as cursor:
        cursor.execute(
            "SELECT input, sealed_input FROM gateway_invocation WHERE id = %s",
            [body["invocation_id"]],
        )
        stored_input, sealed = cursor.fetchone()
    raw = bytes(sealed)
    assert IBAN.encode() not in raw and IBAN not in str(stored_input)
    from gateway.sealing import unseal

    assert unseal(raw)["iban"] == IBAN


def test_a_card_sent_as_a_json_number_is_masked(alice, upstream):
    add_http(alice, "numbers", upstream.url("/echo"))
    sent = {"card": 4111111111111111, "f": 4111111111111111.0, "qty": 3, "id": 123456789012}
    body = alice.invoke("numbers", sent).json()
    assert body["input"] == {
        "card": "4111********1111",
        "f": "4111********1111",
        "qty": 3,
        "id": 123456789012,
    }
    assert json.loads(upstream.calls[-1]["body"])["card"] == "4111********1111"
    assert {"entity": "CREDIT_CARD", "count": 2, "where": "input"} in body["redactions"]
    assert "4111111111111111" not in json.dumps(body)
    with tenant_scope(alice.key.tenant, readonly=True):
        events = list(Event.objects.filter(invocation_id=body["invocation_id"]))
    assert len(events) == 3
    for event in events:
        assert "4111111111111111" not in json.dumps(event.payload)
