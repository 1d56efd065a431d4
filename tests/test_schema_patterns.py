"""Tenant schemas' regular expressions: ECMA-262 as JSON Schema reads them, run by RE2 in
time linear in the text, so that no schema can make a call spin."""

from __future__ import annotations

import copy

import pytest

from gateway.manifests import apply_manifests

from .conftest import echo_manifest, error_of

# Exponential for a backtracking engine: Python's `re` takes minutes on 40 `a` and a `!`.
NESTED = "^(a+)+$"
HOSTILE = "a" * 40 + "!"


def _apply(api, manifest):
    return api.post("/v1/manifests/apply", manifest)


def test_a_nested_quantifier_cannot_make_a_call_spin(alice):
    manifest = echo_manifest(
        "util.nested",
        {"type": "object", "properties": {"w": {"type": "string", "pattern": NESTED}}},
    )
    assert _apply(alice, manifest).status_code == 200
    assert alice.invoke("util.nested", {"w": "aaa"}).status_code == 200
    response = alice.invoke("util.nested", {"w": HOSTILE})
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "invalid_input"
    assert error["details"]["errors"][0]["path"] == "/w"


def test_pattern_properties_are_matched_by_the_same_engine(alice):
    manifest = echo_manifest(
        "util.keys",
        {
            "type": "object",
            "patternProperties": {NESTED: {"type": "integer"}},
            "additionalProperties": False,
        },
    )
    assert _apply(alice, manifest).status_code == 200
    assert alice.invoke("util.keys", {"aaaa": 1}).status_code == 200
    typed = error_of(alice.invoke("util.keys", {"aaaa": "x"}))
    assert typed["code"] == "invalid_input" and typed["details"]["errors"][0]["path"] == "/aaaa"
    # A hostile key matches no pattern (quickly), so it is an additional property.
    extra = alice.invoke("util.keys", {HOSTILE: 1})
    assert extra.status_code == 400 and error_of(extra)["code"] == "invalid_input"
    # `$` is the end of the key, as for values.
    assert alice.invoke("util.keys", {"aaa\n": 1}).status_code == 400


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        (
            {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?=x)x"}}},
            "/spec/input_schema/properties/p/pattern",
        ),
        (
            {"type": "object", "patternProperties": {"^(a)\\1$": {}}},
            "/spec/input_schema/patternProperties/^(a)\\1$",
        ),
        (
            {
                "type": "object",
                "patternProperties": {"^a": {}},
                "allOf": [{"unevaluatedProperties": False}],
            },
            "/spec/input_schema/patternProperties",
        ),
        (  # a property named "properties" is a schema: its keywords count
            {
                "type": "object",
                "properties": {
                    "properties": {
                        "unevaluatedProperties": False,
                        "patternProperties": {NESTED: {}},
                    }
                },
            },
            "/spec/input_schema/properties/properties/patternProperties",
        ),
        (
            {
                "$defs": {
                    "properties": {"unevaluatedProperties": False, "patternProperties": {"^a": {}}}
                },
                "$ref": "#/$defs/properties",
            },
            "/spec/input_schema/$defs/properties/patternProperties",
        ),
    ],
)
def test_apply_refuses_what_the_engine_cannot_run_in_linear_time(alice, schema, path):
    response = _apply(alice, echo_manifest("util.refused", schema))
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert error["code"] == "manifest_invalid"
    assert [e["path"] for e in error["details"]["errors"]] == [path]
    assert alice.invoke("util.refused", {}).status_code == 404


def test_names_and_values_that_look_like_patterns_are_not_read_as_patterns(alice):
    schema = {
        "type": "object",
        "properties": {
            # a property named "pattern", and one named "patternProperties"
            "pattern": {"type": "string"},
            "patternProperties": {"type": "object", "properties": {"(?=": {}}},
        },
        "examples": [{"pattern": "(?=x)"}],
        "const": {"pattern": "(?=x)"},
    }
    manifest = echo_manifest("util.names", copy.deepcopy(schema))
    assert _apply(alice, manifest).status_code == 200, _apply(alice, manifest).content


def test_ecma_escapes_and_classes(alice):
    manifest = echo_manifest(
        "util.ecma",
        {
            "type": "object",
            "properties": {
                "cafe": {"type": "string", "pattern": "^caf\\u00e9$"},
                "digits": {"type": "string", "pattern": "^\\d+$"},
            },
        },
    )
    apply_manifests(tenant=alice.key.tenant, documents=[manifest])
    assert alice.invoke("util.ecma", {"cafe": "café", "digits": "0123"}).status_code == 200
    assert alice.invoke("util.ecma", {"cafe": "cafe"}).status_code == 400
    # ECMA-262's \d is ASCII: Arabic-Indic digits are not digits to a JSON Schema.
    assert alice.invoke("util.ecma", {"digits": "\u0661\u0662"}).status_code == 400


def test_a_stored_schema_with_a_pattern_re2_cannot_run_makes_the_tool_unavailable(alice):
    """Stored by an earlier release (apply refuses it now): the schema is at fault, so
    the answer is 503 for the tool, not 400 for the caller's input."""
    from gateway.models import Tool
    from tenants.scope import tenant_scope

    manifest = echo_manifest(
        "util.old", {"type": "object", "properties": {"p": {"type": "string"}}}
    )
    assert _apply(alice, manifest).status_code == 200
    with tenant_scope(alice.key.tenant):
        tool = Tool.objects.get(tenant=alice.key.tenant, name="util.old")
        stored = tool.manifest
        stored["spec"]["input_schema"]["properties"]["p"]["pattern"] = "^(?=x)x"
        # As a manifest stored by an earlier release would be (its own digest).
        Tool.objects.filter(pk=tool.pk).update(manifest=stored, digest="f" * 64)
    from gateway import pipeline

    pipeline._tool_cache.clear()
    response = alice.invoke("util.old", {"p": "x"}, headers={"Accept-Language": "fr"})
    assert response.status_code == 503, response.content
    error = error_of(response)
    assert error["code"] == "tool_unavailable"
    assert "pattern this gateway cannot run" in error["message_i18n"]["en"]
    assert "motif" in error["message"]


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("^\\S+$", "a\u00a0b", False),  # ECMA's \s has the no-break space
        ("^[\\s]+$", "\u00a0\ufeff\u2028", True),
        ("^a.b$", "a\rb", False),  # ECMA's . has no line terminator
        ("^a.b$", "a\u2028b", False),
        ("^a.b$", "axb", True),
        ("^\\a\\z\\A$", "azA", True),  # letters ECMA escapes to themselves
        ("^\\cJ$", "\n", True),
        ("^[^.]+$", "a.b", False),
        ("^\\d+$", "\u0661\u0662", False),
    ],
)
def test_schema_patterns_read_as_ecma_262(pattern, text, matches):
    from gateway.contracts import schema_regex

    assert bool(schema_regex(pattern).search(text)) is matches


@pytest.mark.parametrize(
    "pattern", ["[\\uD800-\\uDBFF][\\uDC00-\\uDFFF]", "(?<n>a)\\k<n>", "(a)\\1"]
)
def test_surrogates_and_back_references_are_refused(pattern):
    from gateway.contracts import schema_regex

    assert schema_regex(pattern) is None


LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def test_refs_that_lead_back_to_themselves_are_refused_at_apply(alice):
    for field in ("input_schema", "output_schema"):
        manifest = echo_manifest("util.loop", {"type": "object"})
        manifest["spec"][field] = LOOP
        response = _apply(alice, manifest)
        assert response.status_code == 422, response.content
        assert error_of(response)["details"]["errors"][0]["path"] == f"/spec/{field}"
    # A recursive schema that descends into the document is fine.
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    assert _apply(alice, echo_manifest("util.tree", tree)).status_code == 200
    deep = {"kids": [{"kids": [{"kids": []}]}]}
    assert alice.invoke("util.tree", deep).status_code == 200


def test_a_stored_looping_schema_answers_cleanly_and_settles_the_call(alice):
    """Stored before apply refused it: the input's loop makes the tool unavailable (was a
    500); the output's fails the call (was a 500 leaving it `running` for good)."""
    from gateway import pipeline
    from gateway.models import Invocation, Tool
    from tenants.scope import tenant_scope

    assert _apply(alice, echo_manifest("util.in", {"type": "object"})).status_code == 200
    assert _apply(alice, echo_manifest("util.out", {"type": "object"})).status_code == 200
    with tenant_scope(alice.key.tenant):
        for name, field in (("util.in", "input_schema"), ("util.out", "output_schema")):
            tool = Tool.objects.get(tenant=alice.key.tenant, name=name)
            stored = tool.manifest
            stored["spec"][field] = LOOP
            Tool.objects.filter(pk=tool.pk).update(manifest=stored, digest=name * 4)
    pipeline._tool_cache.clear()
    response = alice.invoke("util.in", {})
    assert response.status_code == 503 and error_of(response)["code"] == "tool_unavailable"
    response = alice.invoke("util.out", {})
    assert response.status_code == 502, response.content
    error = error_of(response)
    assert error["code"] == "invalid_output"
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Invocation.objects.get(pk=error["invocation_id"]).status == "failed"


def test_schemas_that_would_evaluate_without_end_or_bound_are_refused_from_the_schema(alice):
    """Read from the schema, not by validating samples: a loop reached under a property
    only, and a chain of allOfs naming the next twice (2^22 evaluations of one value, an
    hour a call, and an hour at apply when apply validated samples)."""
    under = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/a"}},
        **{"$defs": LOOP["$defs"]},
    }
    chain = {f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2} for i in range(22)}
    chain["a22"] = {"type": "string"}
    for schema, words in (
        (under, "lead back to themselves"),
        ({"$defs": chain, "$ref": "#/$defs/a0"}, "more than 10,000 times"),
    ):
        response = _apply(alice, echo_manifest("util.bad", schema))
        assert response.status_code == 422, response.content
        assert words in error_of(response)["details"]["errors"][0]["message"]
