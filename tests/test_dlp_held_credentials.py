"""A credential the gateway holds is a SECRET in every form, whatever its length or JSON
type (SPEC §6, issue 15): an upstream echoing a PIN as a JSON number, or in base64,
reaches neither the agent nor the stored invocation, the events or the audit."""

import base64
import json

from gateway import dlp
from gateway.credentials import set_secret
from gateway.manifests import apply_manifests
from gateway.models import AuditEvent, Event, Invocation
from tenants.scope import tenant_scope

from .conftest import tool_manifest

PIN = "48213377"  # 8 digits: read as text only when it is a held credential
FORMS = [
    PIN,
    base64.b64encode(PIN.encode()).decode(),
    base64.b64encode(b"bot:" + PIN.encode()).decode(),
]


def add_echo(api, upstream):
    # `allow`: the raw input reaches the upstream, which echoes it back as it came.
    manifest = tool_manifest(
        "pin.echo", {"type": "http", "url": upstream.url("/echo")}, dlp={"input": "allow"}
    )
    apply_manifests(tenant=api.key.tenant, documents=[manifest])


def everything_stored(tenant) -> str:
    with tenant_scope(tenant, readonly=True):
        calls = list(Invocation.objects.values("input", "output", "error"))
        links = [e.canonical for e in AuditEvent.objects.all()]
        events = [json.dumps(e.payload) for e in Event.objects.all()]
    assert calls and links and events
    return "\n".join([json.dumps(calls, default=str), *links, *events])


def test_it_masks_a_short_credential_echoed_as_a_number_or_in_base64(alice, bob, upstream):
    set_secret(tenant=alice.key.tenant, name="pin", secret=PIN)
    add_echo(alice, upstream)
    add_echo(bob, upstream)
    sent = {"pin": int(PIN), "raw": FORMS[1], "basic": f"Basic {FORMS[2]}", "qty": 3}

    body = alice.invoke("pin.echo", sent).json()
    assert json.loads(upstream.calls[-1]["body"])["pin"] == int(PIN)  # sent as it was
    assert body["output"]["got"] == {
        "pin": "[SECRET]",
        "raw": "[SECRET]",
        "basic": "Basic [SECRET]",
        "qty": 3,
    }
    assert {"entity": "SECRET", "count": 3, "where": "output"} in body["redactions"]
    shown = json.dumps(body)
    stored = everything_stored(alice.key.tenant)
    for form in FORMS:
        assert form not in shown and form not in stored, form

    # Bob's tenant does not hold this value: his echo of the same numbers is his data
    # (a Basic credential stays a secret by its form).
    got = bob.invoke("pin.echo", sent).json()["output"]["got"]
    assert got == {**sent, "basic": "Basic [SECRET]"}


def test_block_mode_still_looks_for_held_credentials():
    value = {"echo": [int(PIN), {"k": f"raw {FORMS[1]}"}], "n": 3}
    assert dlp.contains_findings(value, secrets=[PIN]) == {"SECRET": 2}
    assert dlp.contains_findings(value) == {}
    assert dlp.contains_findings({"pin": PIN}, entities=["IBAN"], secrets=[PIN]) == {"SECRET": 1}


def test_a_number_holding_no_credential_stays_a_number():
    value = {"pin": 48213378, "f": 1.5, "big": 10**30, "ok": True}
    assert dlp.scrub(value, secrets=[PIN]) == (value, {})
    out, counts = dlp.scrub({"pin": 948213377}, secrets=[PIN])
    assert out == {"pin": "9[SECRET]"} and counts == {"SECRET": 1}
