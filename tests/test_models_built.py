"""`gateway.models.built`: the invoke path's cheap constructor gives the instance that
`Model(**values)` gives."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models.signals import post_init

from gateway.models import Decision, Invocation, UsageEvent, built
from tenants.models import Tenant


def _fields(obj: object) -> dict:
    return {k: v for k, v in vars(obj).items() if k != "_state"}


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (
            Invocation,
            {"id": "tinv_1", "tool": "echo", "status": "running", "input": {"a": 1}, "run_id": ""},
        ),
        (Decision, {"id": "dec_1", "tool": "echo", "allow": True, "reasons": ["r"]}),
        (UsageEvent, {"id": "use_1", "unit": "tool_call", "amount": Decimal("0.5")}),
    ],
)
def test_built_matches_the_model_constructor(model: type, values: dict) -> None:
    tenant = Tenant(name="Acme")
    # Defaults computed at construction (created_at: now) differ by their moment only.
    moments = {
        f.attname for f in model._meta.concrete_fields if f.get_internal_type() == "DateTimeField"
    }
    expected, got = model(tenant=tenant, **values), built(model, tenant=tenant, **values)
    assert _fields(got).keys() == _fields(expected).keys()
    for name, value in _fields(expected).items():
        if name not in moments or value is None:
            assert _fields(got)[name] == value, name
    assert got.tenant is tenant and got.tenant_id == tenant.pk
    assert vars(got._state) == vars(expected._state)
    # Mutable defaults are fresh per instance, as the constructor makes them.
    for name, value in _fields(got).items():
        if isinstance(value, (list, dict)) and name not in values:
            assert value is not _fields(built(model, tenant=tenant, **values))[name]


def test_built_refuses_unknown_names() -> None:
    with pytest.raises(TypeError, match="nope"):
        built(Invocation, id="tinv_1", nope=1)


def test_built_runs_the_constructor_when_init_signals_have_receivers() -> None:
    seen: list[object] = []

    def receiver(sender: type, instance: object, **kwargs: object) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Decision)
    try:
        decision = built(Decision, id="dec_2", tool="echo")
    finally:
        post_init.disconnect(receiver, sender=Decision)
    assert seen == [decision]
