"""POST /v1/manifests/apply: validation with pointers, all-or-nothing, versions, diffs."""

import copy
import json

import pytest
import yaml

from gateway import demo
from gateway.models import ManifestVersion, PolicyModule, Tool
from tenants.scope import tenant_scope

from .conftest import error_of, scope, tool_manifest

ECHO = tool_manifest("util.echo", {"type": "builtin", "callable": "echo"})


def apply(api, body, **query):
    path = "/v1/manifests/apply" + (
        "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    )
    return api.post(path, body)


def test_it_creates_then_reports_unchanged_then_updates_with_a_diff(alice):
    body = apply(alice, ECHO).json()
    assert body == {
        "dry_run": False,
        "results": [
            {
                "kind": "Tool",
                "name": "util.echo",
                "version": "1.0.0",
                "status": "created",
                "diff": body["results"][0]["diff"],
            }
        ],
    }
    assert apply(alice, ECHO).json()["results"][0]["status"] == "unchanged"
    changed = copy.deepcopy(ECHO)
    changed["metadata"]["version"] = "1.1.0"
    changed["spec"]["risk_class"] = "medium"
    result = apply(alice, changed).json()["results"][0]
    assert result["status"] == "updated" and result["version"] == "1.1.0"
    paths = {d["path"]: d for d in result["diff"]}
    assert paths["/spec/risk_class"] == {
        "op": "replace",
        "path": "/spec/risk_class",
        "old": "low",
        "value": "medium",
    }
    assert "/metadata/version" in paths
    with tenant_scope(alice.key.tenant, readonly=True):
        versions = ManifestVersion.objects.filter(tenant=alice.key.tenant, name="util.echo")
        revisions = sorted(versions.values_list("revision", "version"))
        tool = Tool.objects.get(tenant=alice.key.tenant, name="util.echo")
    assert revisions == [(1, "1.0.0"), (2, "1.1.0")]
    assert tool.version == "1.1.0" and tool.revision == 2


def test_it_fills_documented_defaults(alice):
    apply(alice, ECHO)
    with tenant_scope(alice.key.tenant, readonly=True):
        spec = Tool.objects.get(name="util.echo").spec
    assert spec["requires_approval"] is False and spec["idempotent"] is False
    assert spec["rate_limit"] is None and spec["retry"] is None
    assert spec["risk_class"] == "low"
    assert spec["dlp"] == {
        "input": "mask",
        "output": "mask",
        "entities": ["IBAN", "CREDIT_CARD", "EMAIL", "PHONE", "NIR", "SECRET"],
    }


def test_it_applies_a_list_all_or_nothing(alice):
    bad = tool_manifest("bad.tool", {"type": "builtin", "callable": "echo"}, risk_class="extreme")
    response = apply(alice, {"manifests": [ECHO, bad]})
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "manifest_invalid"
    assert error["details"]["errors"] == [
        {
            "manifest": "1:bad.tool",
            "path": "/spec/risk_class",
            "message": error["details"]["errors"][0]["message"],
        }
    ]
    with scope(alice.key.tenant):
        assert not Tool.objects.filter(name="util.echo").exists()
        assert not ManifestVersion.objects.filter(name="util.echo").exists()


def test_it_dry_runs_without_writing(alice):
    body = apply(alice, {"manifests": [ECHO]}, dry_run="true").json()
    assert body["dry_run"] is True and body["results"][0]["status"] == "created"
    with tenant_scope(alice.key.tenant, readonly=True):
        assert not Tool.objects.filter(name="util.echo").exists()
    assert apply(alice, ECHO, dry_run="maybe").status_code == 400


def test_it_accepts_yaml_with_several_documents(alice):
    text = yaml.safe_dump_all([ECHO, demo.crm_lookup_manifest(8001)])
    response = alice.post("/v1/manifests/apply", raw=text, content_type="application/yaml")
    assert response.status_code == 200, response.content
    assert [r["name"] for r in response.json()["results"]] == ["util.echo", "crm.lookup"]


def test_it_answers_invalid_json_for_broken_yaml(alice):
    response = alice.post(
        "/v1/manifests/apply", raw="kind: [unclosed", content_type="application/yaml"
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def _alias_bomb() -> str:
    """359 bytes of YAML that expand to 9^10 strings ("billion laughs")."""
    text, previous = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n', "a"
    for i in range(1, 10):
        name = chr(97 + i)
        text += f"{name}: &{name} [" + ",".join(["*" + previous] * 9) + "]\n"
        previous = name
    return text


def test_yaml_aliases_are_refused_at_once(alice):
    response = alice.post(
        "/v1/manifests/apply?dry_run=true",
        raw=_alias_bomb(),
        content_type="application/yaml",
        headers={"Accept-Language": "fr"},
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_json"
    assert "YAML aliases (*name) are not accepted (line 2, column" in error["message_i18n"]["en"]
    assert error["message"] == error["message_i18n"]["fr"]
    assert "les alias YAML (*nom) ne sont pas acceptés (ligne 2" in error["message"]
    # an anchor without an alias is harmless and stays allowed
    text = yaml.safe_dump(ECHO).replace("apiVersion:", "apiVersion: &v", 1)
    ok = alice.post("/v1/manifests/apply", raw=text, content_type="application/yaml")
    assert ok.status_code == 200, ok.content


@pytest.mark.parametrize(
    ("yaml_value", "reason"),
    [
        ('"\\ud800"', "lone surrogate"),
        (".inf", "Infinity is not valid JSON"),
        ("9" * 5000, "a number has too many digits"),
    ],
)
def test_yaml_values_json_cannot_keep_are_refused(alice, yaml_value, reason):
    manifest = copy.deepcopy(ECHO)
    manifest["metadata"]["description"] = "PLACEHOLDER"
    text = yaml.safe_dump(manifest).replace("PLACEHOLDER", yaml_value)
    response = alice.post("/v1/manifests/apply", raw=text, content_type="application/yaml")
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "invalid_json" and reason in error["message_i18n"]["en"]


def test_the_apply_command_refuses_yaml_aliases(tenant_a, tmp_path):
    from django.core.management import CommandError, call_command

    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    with pytest.raises(CommandError, match="alias"):
        call_command("apply_manifests", str(path), "--tenant", "acme")


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda m: m.pop("apiVersion"), ""),
        (lambda m: m.update(apiVersion="eai/v2"), "/apiVersion"),
        (lambda m: m.update(kind="Tooll"), "/kind"),
        (lambda m: m["metadata"].pop("name"), "/metadata"),
        (lambda m: m["metadata"].update(name="bad name"), "/metadata/name"),
        (lambda m: m["metadata"].update(colour="red"), "/metadata"),
        (lambda m: m["spec"].pop("input_schema"), "/spec"),
        (lambda m: m["spec"].update(input_schema={"type": "objekt"}), "/spec/input_schema/type"),
        (lambda m: m["spec"].update(endpoint={"type": "ftp"}), "/spec/endpoint/type"),
        (
            lambda m: m["spec"].update(endpoint={"type": "http", "url": "http://169.254.169.254/"}),
            "/spec/endpoint/url",
        ),
        (
            lambda m: m["spec"].update(
                endpoint={"type": "http", "url": "http://metadata.google.internal/"}
            ),
            "/spec/endpoint/url",
        ),
        # the same address spelled otherwise: trailing dot, IPv4 inside IPv6 (compatible,
        # NAT64, 6to4, Teredo); and ports that no connection can use
        *[
            (
                lambda m, url=url: m["spec"].update(endpoint={"type": "http", "url": url}),
                "/spec/endpoint/url",
            )
            for url in (
                "http://169.254.169.254./",
                "http://[::169.254.169.254]/",
                "http://[64:ff9b::a9fe:a9fe]/",
                "http://[2002:a9fe:a9fe::]/",
                "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",
                "http://[64:ff9b:1::a9fe:a9fe]/",
                "http://[::ffff:0:a9fe:a9fe]/",
                "http://[64:ff9b:1:a9fe:a9:fe00:808:808]/",
                "http://127.0.0.1:abc/",
                "http://127.0.0.1:99999/",
            )
        ],
        (
            lambda m: m["spec"].update(
                input_schema={"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}
            ),
            "/spec/input_schema/properties/a/$ref",
        ),
        (
            lambda m: m["spec"].update(rate_limit={"requests": 1, "per": "999999999999d"}),
            "/spec/rate_limit/per",
        ),
        (
            lambda m: m["spec"].update(approval={"min_approvers": 1, "expires_in": "367d"}),
            "/spec/approval/expires_in",
        ),
        (
            lambda m: m["spec"].update(endpoint={"type": "http", "url": "ftp://x"}),
            "/spec/endpoint/url",
        ),
        (
            lambda m: m["spec"].update(endpoint={"type": "builtin", "callable": "os.system"}),
            "/spec/endpoint/callable",
        ),
        (lambda m: m["spec"].update(requires_aproval=True), "/spec"),
        (
            lambda m: m["spec"].update(rate_limit={"requests": 10, "per": "1 minute"}),
            "/spec/rate_limit/per",
        ),
        (lambda m: m["spec"].update(cost={"amount": "-1", "currency": "EUR"}), "/spec/cost/amount"),
        (lambda m: m["spec"].update(scopes_required=["nocolon"]), "/spec/scopes_required/0"),
        (lambda m: m["spec"].update(dlp={"entities": ["SSN"]}), "/spec/dlp/entities/0"),
        (lambda m: m["spec"].update(approval={"min_approvers": 0}), "/spec/approval/min_approvers"),
        (lambda m: m["metadata"].update(name="invocations"), "/metadata/name"),
    ],
)
def test_it_reports_each_violation_with_its_pointer(alice, mutate, path):
    manifest = copy.deepcopy(ECHO)
    mutate(manifest)
    response = apply(alice, manifest)
    assert response.status_code == 422, response.content
    errors = error_of(response)["details"]["errors"]
    assert path in [e["path"] for e in errors], errors
    assert all(set(e) == {"manifest", "path", "message"} for e in errors)
    with scope(alice.key.tenant):
        assert not Tool.objects.filter(name="util.echo").exists()


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"s": {"$ref": "https://json-schema.org/draft/2020-12/schema"}},
        },
        {
            "$id": "https://example.com/root.json",
            "$defs": {"x": {"type": "string"}},
            "type": "object",
            "properties": {"a": {"$ref": "root.json#/$defs/x"}, "b": {"$ref": "#/$defs/x"}},
        },
    ],
    ids=["meta-schema", "root-id"],
)
def test_refs_the_validator_resolves_are_accepted(alice, schema):
    manifest = copy.deepcopy(ECHO)
    manifest["spec"]["input_schema"] = schema
    assert apply(alice, manifest).status_code == 200
    # inputs that reach the refs: resolved, so valid and invalid values tell apart
    if "$id" in schema:
        good, bad = {"a": "x", "b": "y"}, {"a": 1}
    else:
        good, bad = {"s": {"type": "string"}}, {"s": {"type": "nope"}}
    assert alice.invoke("util.echo", good).status_code == 200
    assert error_of(alice.invoke("util.echo", bad))["code"] == "invalid_input"


@pytest.mark.parametrize(
    "prop",
    [
        {"$id": "urn:x", "$ref": "URL"},  # under a subschema with its own $id
        {"$dynamicRef": "URL"},
        {"$ref": "http://[::1"},  # not even a URL: was a 500
        {"$id": "http://[::1"},  # an $id that is no URI: a 500 too
    ],
)
def test_remote_refs_are_refused_and_never_fetched(alice, upstream, prop):
    """jsonschema's default registry fetches any URL a $ref names: the metadata address
    included, around every endpoint check. Apply refuses such refs; a schema stored
    before is validated without retrieval."""
    prop = json.loads(json.dumps(prop).replace("URL", upstream.url("/echo")))
    manifest = copy.deepcopy(ECHO)
    manifest["spec"]["input_schema"] = {"type": "object", "properties": {"x": prop}}
    response = apply(alice, manifest)
    assert response.status_code == 422, response.content
    assert error_of(response)["details"]["errors"][0]["path"].startswith("/spec/input_schema")
    assert apply(alice, ECHO).status_code == 200
    with tenant_scope(alice.key.tenant, readonly=True):
        tool = Tool.objects.get(tenant=alice.key.tenant, name="util.echo")
    stored = tool.manifest
    stored["spec"]["input_schema"] = manifest["spec"]["input_schema"]
    with scope(alice.key.tenant):
        Tool.objects.filter(pk=tool.pk).update(manifest=stored, digest="forced-" + json.dumps(prop))
    called = len(upstream.calls)
    answer = alice.invoke("util.echo", {"x": 1})
    assert answer.status_code in (200, 400, 503), answer.content  # never a 500
    assert len(upstream.calls) == called  # nothing left the gateway


def test_it_refuses_duplicates_in_one_request(alice):
    response = apply(alice, [ECHO, ECHO])
    assert response.status_code == 422


def test_it_needs_the_apply_scope(make_api, tenant_a):
    api = make_api(tenant_a, scopes=["tools:read"])
    response = apply(api, ECHO)
    assert response.status_code == 403
    assert error_of(response)["code"] == "insufficient_scope"


def test_it_applies_to_the_key_tenant_only(alice, bob):
    apply(alice, ECHO)
    with tenant_scope(alice.key.tenant, readonly=True):
        assert Tool.objects.filter(name="util.echo", tenant=alice.key.tenant).exists()
    with tenant_scope(bob.key.tenant, readonly=True):
        assert not Tool.objects.filter(name="util.echo", tenant=bob.key.tenant).exists()
    assert bob.get("/v1/tools/util.echo").status_code == 404


POLICY = {
    "apiVersion": "eai/v1",
    "kind": "Policy",
    "metadata": {"name": "no-night-payments", "version": "1"},
    "spec": {
        "rego": (
            "package eai.tool\n\nimport rego.v1\n\n"
            'deny contains "agent blocked" if {\n\tinput.principal.agent == "rogue"\n}\n'
        )
    },
}


def test_it_applies_a_tenant_policy_that_the_pipeline_enforces(alice, make_api):
    response = apply(alice, POLICY)
    assert response.status_code == 200, response.content
    with tenant_scope(alice.key.tenant, readonly=True):
        assert PolicyModule.objects.filter(tenant=alice.key.tenant).count() == 1
    rogue = make_api(alice.key.tenant, agent="rogue")
    error = error_of(rogue.invoke("jira.search", {"q": "x"}))
    assert error["code"] == "policy_denied" and "agent blocked" in error["message"]
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200


@pytest.mark.parametrize(
    "rego",
    ["package eai.tool\n\ndeny contains x if {", "package other\n\nallow := true\n"],
)
def test_it_refuses_a_policy_that_does_not_compile_or_is_elsewhere(alice, rego):
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = rego
    response = apply(alice, manifest)
    assert response.status_code == 422
    assert error_of(response)["details"]["errors"][0]["path"] == "/spec/rego"


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        # The first two used to apply, then crash the server process on every call.
        ("deny := set()", "does not compile"),
        ("missing_scopes := set()", "cannot redefine 'missing_scopes'"),
        ('decision := {"allow": true}', "cannot redefine 'decision'"),
        ('  required_scopes := ["tools:invoke"]', "cannot redefine 'required_scopes'"),
        ("default decision := {}", "cannot redefine 'decision'"),
        ('missing_scopes contains "x" if false', "cannot redefine 'missing_scopes'"),
    ],
)
def test_it_refuses_a_policy_that_redefines_or_breaks_the_default(alice, rule, why):
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = f"package eai.tool\n\nimport rego.v1\n\n{rule}\n"
    response = apply(alice, manifest)
    assert response.status_code == 422, response.content
    error = error_of(response)["details"]["errors"][0]
    assert error["path"] == "/spec/rego" and why in error["message"]
    with scope(alice.key.tenant):
        assert not PolicyModule.objects.filter(tenant=alice.key.tenant).exists()
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200


def test_a_policy_that_reads_the_default_rules_applies(alice):
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = (
        "package eai.tool\n\nimport rego.v1\n\n"
        'deny contains "too many scopes missing" if {\n\tcount(missing_scopes) > 5\n}\n'
        'deny contains "odd" if {\n\tmissing_scopes[_] == "odd:scope"\n}\n'
    )
    assert apply(alice, manifest).status_code == 200
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200


def test_a_stored_module_that_cannot_be_evaluated_denies_in_both_languages(alice):
    """A module stored before apply checked as it does now fails closed, with a
    translated reason (not the engine's words) and no crash."""
    for name, rego in [
        ("broken", "package eai.tool\nimport rego.v1\ndeny := set()\n"),
        ("conflict", 'package eai.tool\nimport rego.v1\ndecision := {"allow": true}\n'),
    ]:
        with tenant_scope(alice.key.tenant):
            module = PolicyModule.objects.create(
                tenant=alice.key.tenant, name=name, version="1", rego=rego, digest=name
            )
        for language, words in [
            ("en", "the policy cannot be evaluated"),
            ("fr", "la politique ne peut pas être évaluée"),
        ]:
            response = alice.invoke("jira.search", {"q": "x"}, {"Accept-Language": language})
            error = error_of(response)
            assert response.status_code == 403 and error["code"] == "policy_denied"
            assert words in error["message"] and "policy error" not in error["message"]
        with tenant_scope(alice.key.tenant):
            module.delete()


def test_the_apply_command_applies_files(tenant_a, tmp_path):
    from django.core.management import call_command

    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump(ECHO))
    jpath = tmp_path / "crm.json"
    jpath.write_text(json.dumps(demo.crm_lookup_manifest(8001)))
    call_command("apply_manifests", str(path), str(jpath), "--tenant", "acme")
    with tenant_scope(tenant_a, readonly=True):
        tools = Tool.objects.filter(tenant=tenant_a, name__in=["util.echo", "crm.lookup"])
        assert tools.count() == 2


def test_the_apply_command_takes_the_only_tenant_as_the_spec_writes_it(tenant_a, tmp_path):
    """SPEC §8: `apply_manifests PATH…`. With one tenant it is the one; with several,
    the command names them and applies nothing."""
    from django.core.management import CommandError, call_command

    from .conftest import seed_tenant

    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump(ECHO))
    call_command("apply_manifests", str(path))
    with tenant_scope(tenant_a, readonly=True):
        assert Tool.objects.filter(tenant=tenant_a, name="util.echo").exists()
    other = seed_tenant("globex")
    changed = copy.deepcopy(ECHO)
    changed["metadata"]["version"] = "2.0.0"
    path.write_text(yaml.safe_dump(changed))
    with pytest.raises(CommandError, match="--tenant SLUG .tenants: acme, globex"):
        call_command("apply_manifests", str(path))
    with tenant_scope(tenant_a, readonly=True):
        assert Tool.objects.get(tenant=tenant_a, name="util.echo").version == "1.0.0"
    with tenant_scope(other, readonly=True):
        assert not Tool.objects.filter(tenant=other, name="util.echo").exists()


@pytest.mark.parametrize(
    "url", ["http://[64:ff9b:1::10.0.0.1]/", "http://[64:ff9b:1::1]/", "http://[fd00::1]:8080/"]
)
def test_ordinary_private_ipv6_endpoints_are_accepted(alice, url):
    manifest = copy.deepcopy(ECHO)
    manifest["spec"]["endpoint"] = {"type": "http", "url": url}
    assert apply(alice, manifest).status_code == 200


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        (
            {"endpoint": {"type": "http", "url": "http://admin:hunter2@127.0.0.1:9/echo"}},
            "/spec/endpoint/url",
            "credentials in the URL",
        ),
        (
            {"endpoint": {"type": "http", "url": "http://token@127.0.0.1:9/echo"}},
            "/spec/endpoint/url",
            "credentials in the URL",
        ),
        (
            {"credential_ref": "bot", "credential_injection": {"header": "Host"}},
            "/spec/credential_injection",
            "sets the header 'Host'",
        ),
        (
            {
                "credential_ref": "bot",
                "credential_injection": {"header": "X-Key", "template": "{secret}\r\nX-Evil: 1"},
            },
            "/spec/credential_injection",
            "control characters",
        ),
        (
            {
                "endpoint": {
                    "type": "http",
                    "url": "http://127.0.0.1:9/",
                    "headers": {"X-A": "a\nb"},
                }
            },
            "/spec/endpoint/headers/X-A",
            "control characters",
        ),
        (
            {
                "endpoint": {
                    "type": "http",
                    "url": "http://127.0.0.1:9/",
                    "headers": {"Content-Length": "5"},
                }
            },
            "/spec/endpoint/headers/Content-Length",
            "sets the header",
        ),
        (
            {"endpoint": {"type": "http", "url": "http://127.0.0.1:9/", "headers": {"X A": "1"}}},
            "/spec/endpoint/headers/X A",
            "not a header field name",
        ),
    ],
)
def test_it_refuses_endpoints_whose_headers_or_url_cannot_be_sent_as_written(
    alice, spec, path, words
):
    manifest = copy.deepcopy(ECHO)
    manifest["spec"].update(spec)
    response = apply(alice, manifest)
    assert response.status_code == 422, response.content
    error = error_of(response)["details"]["errors"][0]
    assert error["path"] == path and words in error["message"], error
    verdict = alice.post("/v1/contracts/tool-manifest/validate", manifest).json()
    assert verdict["valid"] is False
    assert verdict["errors"][0]["path"] == path and words in verdict["errors"][0]["message"]
    with scope(alice.key.tenant):
        assert not Tool.objects.filter(tenant=alice.key.tenant, name="util.echo").exists()


def test_custom_headers_and_injection_that_can_be_sent_apply(alice):
    manifest = copy.deepcopy(ECHO)
    manifest["spec"].update(
        endpoint={"type": "http", "url": "http://127.0.0.1:9/", "headers": {"X-Team": "a b"}},
        credential_ref="bot",
        credential_injection={"header": "X-Api-Key", "template": "key={secret}"},
    )
    assert apply(alice, manifest).status_code == 200


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("metadata", "version"), "1.0.0\n"),
        (("metadata", "name"), "util.echo\n"),
        (("spec", "cost"), {"amount": "1.00", "currency": "EUR\n"}),
    ],
)
def test_a_value_with_a_trailing_newline_breaks_the_pattern(alice, where, value):
    """JSON Schema patterns are ECMA-262: `$` is the end of the string, not also the
    place before a final newline as in Python."""
    manifest = copy.deepcopy(ECHO)
    manifest[where[0]][where[1]] = value
    response = apply(alice, manifest)
    assert response.status_code == 422, response.content
    assert error_of(response)["details"]["errors"][0]["path"].startswith(f"/{where[0]}/{where[1]}")


def test_schema_regex_ends_at_the_end_of_the_string():
    from gateway.contracts import schema_regex

    assert schema_regex("^[a-z]+$").search("abc") and not schema_regex("^[a-z]+$").search("abc\n")
    assert schema_regex(r"^a\$$").search("a$") and not schema_regex(r"^a\$$").search("a$\n")
    assert schema_regex("^[$]x$").search("$x")  # a `$` in a class is a character
    assert schema_regex("^(a|b$)").search("b") and not schema_regex("^(b$)").search("b\n")


@pytest.mark.parametrize(
    "rego",
    [
        # Shadowing built-ins the default policy calls, to lift its denial for real callers
        # while a caller with no scope at all (the apply-time trial) is still denied.
        "count(x) := 0 if input.principal.scopes != []\n"
        "count(x) := 1 if input.principal.scopes == []\n",
        'array.concat(a, b) := ["tools:invoke"]\n',
        "object.get(o, k, d) := []\n",
    ],
)
def test_a_tenant_module_cannot_lift_the_default_denial(alice, make_api, rego):
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = f"package eai.tool\n\nimport rego.v1\n\n{rego}"
    if apply(alice, manifest).status_code != 200:
        return  # refused at apply: nothing to lift
    weak = make_api(alice.key.tenant, scopes=["tools:invoke"])
    error = error_of(weak.invoke("secret.tool", {}))
    assert error["code"] == "policy_denied" and "secret:read" in error["message"]
    none = make_api(alice.key.tenant, scopes=["audit:read"])
    assert error_of(none.invoke("secret.tool", {}))["code"] == "policy_denied"


def test_a_tenant_module_adds_obligations_and_keeps_the_defaults(alice):
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = (
        "package eai.tool\n\nimport rego.v1\n\n"
        'obligations contains {"type": "dlp", "entities": ["EMAIL"], "action": "mask"} if true\n'
    )
    assert apply(alice, manifest).status_code == 200
    response = alice.invoke(
        "payments.transfer", {"iban": "FR7630006000011234567890189", "amount": "1.00"}
    )
    assert response.status_code == 202, response.content
    parked = response.json()
    decision = alice.get(f"/v1/decisions/{parked['decision_id']}").json()
    kinds = sorted(o["type"] for o in decision["obligations"])
    assert kinds == ["dlp", "require_approval"], decision


def test_a_class_that_starts_with_a_bracket_keeps_its_dollar():
    from gateway.contracts import schema_regex

    assert schema_regex("^[]$]+$").search("$]") and not schema_regex("^[]$]+$").search("a")
    assert schema_regex("^[^]$]+$").search("ab") and not schema_regex("^[^]$]+$").search("a$")


@pytest.mark.parametrize(
    "rule",
    [
        'deny contains "r" if { some i in numbers.range(1, 100000000); i < 0 }',
        'deny contains "r" if { xs := numbers["range"](1, 100000000); count(xs) < 0 }',
        # behind a guard the trial call does not pass, and through `with`
        "r(a, b) := [a]\n"
        'deny contains "r" if { input.tool.name != "trial"; '
        "xs := r(1, 100000000) with r as numbers . range; count(xs) < 0 }",
    ],
)
def test_a_policy_module_with_an_unbounded_range_is_refused(alice, rule):
    """`numbers.range(1, 100000000)` grew the server to 24 GB until the kernel killed it."""
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = f"package eai.tool\n\nimport rego.v1\n\n{rule}\n"
    response = apply(alice, manifest)
    assert response.status_code == 422
    error = error_of(response)["details"]["errors"][0]
    assert error["path"] == "/spec/rego" and "numbers.range" in error["message"]


def test_a_policy_modules_trial_runs_bounded_outside_the_server(alice, monkeypatch, settings):
    """Four nested loops over 100 numbers (10^8 steps): the trial's own process is killed
    at its bound and the module refused; the server goes on. (The invoke budget would
    refuse it sooner: it is lifted here to reach the trial's own bound.)"""
    from gateway import policy

    monkeypatch.setattr(policy, "TRIAL_SECONDS", 2.0)
    settings.EAI_POLICY_CPU_MS = 60_000
    settings.EAI_POLICY_MEMORY_MB = 64 * 1024
    numbers = "[" + ",".join(str(i) for i in range(100)) + "]"
    manifest = copy.deepcopy(POLICY)
    manifest["spec"]["rego"] = (
        "package eai.tool\n\nimport rego.v1\n\n"
        f"a := {numbers}\n"
        'deny contains "x" if {\n'
        "\tcount([1 | some i in a; some j in a; some k in a; some l in a]) < 0\n"
        "}\n"
    )
    response = apply(alice, manifest)
    assert response.status_code == 422, response.content
    assert "exceeded its bounds" in error_of(response)["details"]["errors"][0]["message"]
    assert alice.invoke("jira.search", {"q": "x"}).status_code == 200
