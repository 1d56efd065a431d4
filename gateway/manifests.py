"""Applying manifests: validate every one, then apply all or nothing.

A manifest is checked against `contracts/v1/tool-manifest.schema.json` and then for what
a schema cannot say (the input schema is itself a valid JSON Schema, the endpoint is not
a link-local or metadata address, the builtin exists, the Rego compiles). Applying a
changed manifest keeps every earlier version (`ManifestVersion`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from django.db import transaction
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from gateway import audit, builtins, policy
from gateway import sandbox as sandboxes
from gateway.contracts import (
    contract_validator,
    json_pointer,
    schema_errors,
    schema_regex,
)
from gateway.endpoints import FIELD_NAME_RE, resolved_refusal, url_refusal
from gateway.models import MCP_GATEWAY_TOOLS, ManifestVersion, PolicyModule, Tool, mcp_tool_name
from tenants.models import ApiKey, Tenant
from tenants.scope import tenant_scope

# `/v1/tools/invocations` is a route: a tool of that name could not be read.
RESERVED_TOOL_NAMES = {"invocations"}
ALL_ENTITIES = ["IBAN", "CREDIT_CARD", "EMAIL", "PHONE", "NIR", "SECRET"]

# The documented default of every optional spec field (SPEC §5).
TOOL_DEFAULTS: dict[str, Any] = {
    "output_schema": None,
    "scopes_required": [],
    "requires_approval": False,
    "approval": {"min_approvers": 1, "expires_in": "1h"},
    "rate_limit": None,
    "sandbox_profile": "none",
    "credential_ref": None,
    "credential_injection": {"header": "Authorization", "template": "Bearer {secret}"},
    "cost": {"amount": "0", "currency": "EUR"},
    "risk_class": "low",
    "action_class": "read",
    "network": "internal",
    "idempotent": False,
    "retry": None,
    "circuit_breaker": {"failure_threshold": 5, "reset_after": "30s"},
    "dlp": {"input": "mask", "output": "mask", "entities": ALL_ENTITIES},
}
ENDPOINT_DEFAULTS: dict[str, Any] = {"timeout_ms": 30000}
HTTP_ENDPOINT_DEFAULTS: dict[str, Any] = {"method": "POST"}
RATE_LIMIT_DEFAULTS: dict[str, Any] = {"scope": "tenant"}
RETRY_DEFAULTS: dict[str, Any] = {"max_attempts": 1, "backoff_ms": 200}


DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_S = 366 * 86400


def duration_seconds(text: str) -> float:
    """Seconds in a manifest duration (`<number><ms|s|m|h|d>`, e.g. `30s`, `1h`)."""
    match = DURATION_RE.match(text)
    if not match:
        raise ValueError(f"bad duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


class ManifestInvalid(Exception):
    """One or more manifests are invalid; `errors` are `{manifest, path, message}`."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} manifest error(s)")


@dataclass
class ApplyResult:
    kind: str
    name: str
    version: str
    status: str  # created | updated | unchanged
    diff: list[dict[str, Any]]
    revision: int = 0
    digest: str = ""
    mcp_pin: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "version": self.version,
            "status": self.status,
            "diff": self.diff,
        }


def split_documents(body: Any) -> list[Any]:
    """One manifest, a list, or `{"manifests": [...]}` as a list of manifests."""
    if isinstance(body, dict) and set(body) == {"manifests"}:
        body = body["manifests"]
        if not isinstance(body, list):
            raise ManifestInvalid(
                [{"manifest": None, "path": "/manifests", "message": "must be a list"}]
            )
    if isinstance(body, list):
        if not body:
            raise ManifestInvalid([{"manifest": None, "path": "", "message": "no manifest"}])
        return body
    return [body]


def normalize(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with every documented default written out (what is stored)."""
    manifest = copy.deepcopy(manifest)
    manifest["metadata"].setdefault("description", "")
    if manifest["kind"] != "Tool":
        return manifest
    spec = manifest["spec"]
    for name, default in TOOL_DEFAULTS.items():
        if name not in spec:
            spec[name] = copy.deepcopy(default)
        elif isinstance(default, dict) and isinstance(spec[name], dict):
            spec[name] = {**default, **spec[name]}
    endpoint = spec["endpoint"]
    defaults = dict(ENDPOINT_DEFAULTS)
    if endpoint["type"] == "http":
        defaults.update(HTTP_ENDPOINT_DEFAULTS)
    spec["endpoint"] = {**defaults, **endpoint}
    if endpoint["type"] == "sandbox" and spec["sandbox_profile"] in sandboxes.BUILTIN:
        # The profile alone decides a sandbox's network; the catalog says which.
        spec["network"] = "external" if spec["sandbox_profile"] == "egress" else "none"
    if spec["rate_limit"]:
        spec["rate_limit"] = {**RATE_LIMIT_DEFAULTS, **spec["rate_limit"]}
    if spec["retry"]:
        spec["retry"] = {**RETRY_DEFAULTS, **spec["retry"]}
    return manifest


def manifest_digest(manifest: dict[str, Any]) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """JSON-pointer changes from `old` to `new`: add, remove, replace."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[dict[str, Any]] = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}/{json_pointer([key])[1:]}"
            if key not in old:
                changes.append({"op": "add", "path": sub, "value": new[key]})
            elif key not in new:
                changes.append({"op": "remove", "path": sub, "old": old[key]})
            else:
                changes.extend(diff(old[key], new[key], sub))
        return changes
    if old == new and type(old) is type(new):
        return []
    return [{"op": "replace", "path": path, "old": old, "value": new}]


_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})  # values, not schemas


def _unresolvable_refs(schema: Any) -> list[tuple[list[Any], str]]:
    """Each `$ref` / `$dynamicRef` of `schema` that resolves to nothing, with where it
    stands, resolved as the validator does: against the schema itself (its `$id` as the
    base, and embedded resources with their own `$id`) and the published meta-schemas,
    never over the network (the validators are built without retrieval). Checked at
    apply: a dangling one would fail every call that reaches it. A relative ref under an
    embedded resource with a relative `$id` is left to the validator."""
    root = schema.get("$id") if isinstance(schema.get("$id"), str) else "urn:eai:manifest-schema"
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    try:
        registry = SPECIFICATIONS.with_resource(root, resource).crawl()
    except (Unresolvable, ValueError):  # an `$id` that is no URI ("http://[::1")
        return [([], "an $id that is not a valid URI")]
    found: list[tuple[list[Any], str]] = []
    stack: list[tuple[Any, list[Any], str | None]] = [(schema, [], root)]
    while stack:
        node, path, base = stack.pop()
        if isinstance(node, dict):
            own_id = node.get("$id") if path else None
            if isinstance(own_id, str):
                base = own_id if _ABSOLUTE.match(own_id) else None
            for keyword in ("$ref", "$dynamicRef"):
                ref = node.get(keyword)
                if not isinstance(ref, str):
                    continue
                if keyword == "$dynamicRef" and ref.startswith("#"):
                    continue  # resolved against dynamic anchors at validation time
                if base is None and not _ABSOLUTE.match(ref):
                    continue
                try:
                    registry.resolver(base or root).lookup(ref)
                except (Unresolvable, ValueError):  # ValueError: "http://[::1" and kin
                    found.append(([*path, keyword], ref))
            stack.extend((v, [*path, k], base) for k, v in node.items() if k not in _DATA_KEYWORDS)
        elif isinstance(node, list):
            stack.extend((v, [*path, i], base) for i, v in enumerate(node))
    return sorted(found, key=lambda item: [str(p) for p in item[0]])


_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")

# Keywords whose value maps names to subschemas: their keys are names, not keywords.
_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


# Keywords that apply subschemas to the same value (not to a part of it).
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("not", "if", "then", "else")
MAX_IN_PLACE_PATHS = 10_000


def _endless(schema: Any) -> str | None:
    """Why validating with `schema` would not end, or would take too long, else None;
    read from the schema alone, without validating anything.

    `$ref`s that lead back to themselves through keywords that stay on the same value
    (`{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref":
    "#/$defs/a"}`) recurse until Python gives up, on every call; a recursive schema that
    descends into the value (a tree) ends. And a chain of `allOf`s each naming the next
    twice evaluates a value 2^n times: past MAX_IN_PLACE_PATHS it is refused."""
    nodes: dict[str, dict[str, Any]] = {}
    anchors: dict[str, str] = {}
    for path, node in _subschemas(schema):
        pointer = json_pointer(path)
        nodes[pointer] = node
        if isinstance(node.get("$anchor"), str):
            anchors[node["$anchor"]] = pointer

    def in_place(pointer: str) -> list[str]:
        node = nodes[pointer]
        found = []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = anchors.get(ref[1:]) if ref[1:2] != "/" and ref != "#" else unquote(ref[1:])
            if target is not None and target in nodes:
                found.append(target)
        for key in _IN_PLACE_LISTS:
            if isinstance(node.get(key), list):
                found += [f"{pointer}/{key}/{i}" for i in range(len(node[key]))]
        found += [f"{pointer}/{key}" for key in _IN_PLACE_ONE if isinstance(node.get(key), dict)]
        if isinstance(node.get("dependentSchemas"), dict):
            found += [
                f"{pointer}/dependentSchemas{json_pointer([k])}" for k in node["dependentSchemas"]
            ]
        return [f for f in found if f in nodes]

    paths: dict[str, int] = {}
    for start in nodes:
        if start in paths:
            continue
        on_path: set[str] = set()
        work: list[tuple[str, bool]] = [(start, False)]
        while work:
            pointer, done = work.pop()
            if done:
                on_path.discard(pointer)
                paths[pointer] = 1 + sum(paths[c] for c in in_place(pointer))
                if paths[pointer] > MAX_IN_PLACE_PATHS:
                    return (
                        "it evaluates one value more than "
                        f"{MAX_IN_PLACE_PATHS:,} times through allOf/anyOf/oneOf/$ref"
                    )
                continue
            if pointer in paths:
                continue
            if pointer in on_path:
                return "its $refs lead back to themselves without reading any of the document"
            on_path.add(pointer)
            work.append((pointer, True))
            for child in in_place(pointer):
                if child in on_path:
                    return "its $refs lead back to themselves without reading any of the document"
                if child not in paths:
                    work.append((child, False))
    return None


def _subschemas(schema: Any) -> Iterator[tuple[list[Any], dict[str, Any]]]:
    """Each subschema of `schema` with its path. What a node is comes from the keyword
    above it, not from its name: a property called "properties" is a schema like any
    other, and values (`const`, `enum`, `default`, `examples`) are not schemas."""
    stack: list[tuple[Any, list[Any], bool]] = [(schema, [], False)]  # (node, path, names?)
    while stack:
        node, path, names = stack.pop()
        if isinstance(node, list):
            stack.extend((v, [*path, i], False) for i, v in enumerate(node))
        elif isinstance(node, dict) and names:  # name → subschema
            stack.extend((v, [*path, k], False) for k, v in node.items())
        elif isinstance(node, dict):
            yield path, node
            stack.extend(
                (v, [*path, k], k in _NAME_MAPS) for k, v in node.items() if k not in _DATA_KEYWORDS
            )


def _pattern_errors(schema: Any) -> list[tuple[list[Any], str]]:
    """Each `pattern` and `patternProperties` name of `schema` that the validators' regex
    engine (RE2, linear in the text: `gateway.contracts.schema_regex`) cannot take, and a
    `patternProperties` in a schema that also has `unevaluatedProperties`, whose
    evaluation jsonschema does with Python's backtracking engine."""
    found: list[tuple[list[Any], str]] = []
    uses: dict[str, list[Any]] = {}
    for path, node in _subschemas(schema):
        candidates = []
        if isinstance(node.get("pattern"), str):
            candidates.append(([*path, "pattern"], node["pattern"]))
        if isinstance(node.get("patternProperties"), dict):
            uses.setdefault("patternProperties", [*path, "patternProperties"])
            candidates += [
                ([*path, "patternProperties", name], name) for name in node["patternProperties"]
            ]
        if "unevaluatedProperties" in node:
            uses.setdefault("unevaluatedProperties", [*path, "unevaluatedProperties"])
        for where, pattern in candidates:
            if schema_regex(pattern) is None:
                found.append(
                    (
                        where,
                        f"pattern {pattern[:200]!r}: look-arounds and back-references are "
                        "not supported (nor is a pattern over RE2's size bound)",
                    )
                )
    if len(uses) == 2:
        found.append(
            (
                uses["patternProperties"],
                "patternProperties cannot be used with unevaluatedProperties",
            )
        )
    return sorted(found, key=lambda item: [str(p) for p in item[0]])


def _semantic_errors(
    manifest: dict[str, Any], trial: Callable[[], dict[str, Any]]
) -> list[dict[str, str]]:
    errors: list[dict[str, str]] = []
    spec = manifest["spec"]
    if manifest["kind"] == "Policy":
        reason = policy.check_module(spec["rego"], trial())
        if reason:
            errors.append({"path": "/spec/rego", "message": reason})
        return errors
    if manifest["kind"] == "SandboxProfile":
        if (
            manifest["metadata"]["name"] in sandboxes.BUILTIN
            or manifest["metadata"]["name"] == "none"
        ):
            errors.append({"path": "/metadata/name", "message": "reserved: a built-in profile"})
        return errors + sandboxes.profile_errors(spec)
    if spec["endpoint"]["type"] == "sandbox" and spec.get("sandbox_profile", "none") == "none":
        errors.append(
            {
                "path": "/spec/sandbox_profile",
                "message": "a sandbox endpoint needs a profile (strict, egress or the tenant's)",
            }
        )
    if manifest["metadata"]["name"] in RESERVED_TOOL_NAMES:
        errors.append(
            {"path": "/metadata/name", "message": "reserved: it names a route under /v1/tools"}
        )
    if mcp_tool_name(manifest["metadata"]["name"]) in MCP_GATEWAY_TOOLS:
        errors.append(
            {"path": "/metadata/name", "message": "reserved: it names a gateway tool of /v1/mcp"}
        )
    for field in ("input_schema", "output_schema"):
        if spec.get(field) is None:
            continue
        try:
            Draft202012Validator.check_schema(spec[field])
        except SchemaError as exc:
            errors.append(
                {
                    "path": f"/spec/{field}{json_pointer(exc.absolute_path)}",
                    "message": f"not a valid JSON Schema: {exc.message[:300]}",
                }
            )
            continue
        endless = _endless(spec[field])
        if endless:
            errors.append({"path": f"/spec/{field}", "message": f"not usable: {endless}"})
            continue
        for where, message in _pattern_errors(spec[field]):
            errors.append({"path": f"/spec/{field}{json_pointer(where)}", "message": message})
        for where, ref in _unresolvable_refs(spec[field]):
            message = (
                f"not a valid JSON Schema: {ref}"
                if not where
                else f"not a valid JSON Schema: {where[-1]} {ref[:200]!r} resolves to nothing"
            )
            errors.append({"path": f"/spec/{field}{json_pointer(where)}", "message": message})
    for path, value in (
        ("/spec/rate_limit/per", (spec.get("rate_limit") or {}).get("per")),
        ("/spec/approval/expires_in", (spec.get("approval") or {}).get("expires_in")),
        (
            "/spec/circuit_breaker/reset_after",
            (spec.get("circuit_breaker") or {}).get("reset_after"),
        ),
    ):
        # A bound the gateway can count in: 999999999999d overflows dates and the audit
        # chain's canonical numbers, and no window or wait needs more than a year.
        if isinstance(value, str) and duration_seconds(value) > MAX_DURATION_S:
            errors.append({"path": path, "message": "at most 366d"})
    endpoint = spec["endpoint"]
    if "url" in endpoint:
        reason = url_refusal(endpoint["url"])
        if reason:
            errors.append({"path": "/spec/endpoint/url", "message": f"forbidden: {reason}"})
        elif "@" in urlsplit(endpoint["url"]).netloc:
            # The catalog shows the URL to every agent, and user:password@ is never sent
            # as credentials: a secret goes through credential_ref.
            errors.append(
                {
                    "path": "/spec/endpoint/url",
                    "message": "forbidden: credentials in the URL; use credential_ref",
                }
            )
    for name, value in (endpoint.get("headers") or {}).items():
        errors += _header_errors(f"/spec/endpoint/headers/{json_pointer([name])[1:]}", name, value)
    injection = spec.get("credential_injection") or {}
    if "header" in injection or "template" in injection:
        errors += _header_errors(
            "/spec/credential_injection",
            injection.get("header", "Authorization"),
            injection.get("template", ""),
        )
    if endpoint["type"] == "builtin" and endpoint["callable"] not in builtins.REGISTRY:
        errors.append(
            {
                "path": "/spec/endpoint/callable",
                "message": f"unknown builtin '{endpoint['callable']}'",
            }
        )
    return errors


# Header fields the gateway writes itself or that belong to the connection: a manifest
# that set them would be ignored, or would break the request framing.
_GATEWAY_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "accept-encoding",
        "traceparent",
        "tracestate",
    }
)
_FIELD_VALUE_BAD_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # CR, LF, NUL, ...


def _header_errors(path: str, name: str, value: str) -> list[dict[str, str]]:
    """Why a header field a manifest sends upstream cannot be sent as written."""
    if not FIELD_NAME_RE.match(name):
        return [{"path": path, "message": f"not a header field name: {name[:100]!r}"}]
    if name.lower() in _GATEWAY_HEADERS:
        return [{"path": path, "message": f"the gateway sets the header '{name}' itself"}]
    if _FIELD_VALUE_BAD_RE.search(value):
        return [{"path": path, "message": "a header value may not hold control characters"}]
    return []


def validate_manifests(
    documents: list[Any], *, tenant: Tenant | None = None
) -> list[dict[str, Any]]:
    """Validate each document; return them normalized or raise ManifestInvalid.

    A policy module is tried on a call shaped as `tenant`'s own (one of its keys and of
    its tools, those of this request included), or a made-up one without a tenant."""
    validator = contract_validator("tool-manifest")
    errors: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], int] = {}
    mcp_names: dict[str, str] = {}  # MCP name -> the manifest name that has it
    normalized: list[dict[str, Any]] = []
    batch = [
        normalize(d)
        for d in documents
        if isinstance(d, dict) and d.get("kind") == "Tool" and not schema_errors(validator, d)
    ]
    for index, document in enumerate(documents):
        label = _label(document, index)
        found = schema_errors(validator, document)
        if not found:
            found = _semantic_errors(document, lambda: _trial_document(tenant, batch))
        if not found:
            ident = (document["kind"], document["metadata"]["name"])
            if ident in seen:
                found = [{"path": "/metadata/name", "message": "duplicate in this request"}]
            seen[ident] = index
            if document["kind"] == "Tool" and not found:
                name = document["metadata"]["name"]
                other = mcp_names.setdefault(mcp_tool_name(name), name)
                if other != name:
                    found = [_mcp_collision(name, other)]
        errors.extend({"manifest": label, **error} for error in found)
        if not found:
            normalized.append(normalize(document))
    if errors:
        raise ManifestInvalid(errors)
    return normalized


def _trial_document(tenant: Tenant | None, batch: list[dict[str, Any]]) -> dict[str, Any]:
    """A trial call as one of `tenant`'s would be: a random one of its usable keys and of
    its tools (stored, or applied in the same request), each drawn afresh."""
    if tenant is None:
        return policy.trial_document()
    rng = secrets.SystemRandom()
    with tenant_scope(tenant, readonly=True):
        stored = list(Tool.objects.for_tenant(tenant).filter(disabled=False)[:200])
        now = timezone.now()
        keys = list(
            ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True)
            .exclude(expires_at__lte=now)
            .only("key_id", "agent", "scopes", "user_id")[:200]
        )
    tools = [(t.name, t.version, t.spec) for t in stored]
    tools += [(m["metadata"]["name"], m["metadata"]["version"], m["spec"]) for m in batch]
    principal = None
    if keys:
        key = rng.choice(keys)
        principal = {
            "key_id": key.public_id,
            "agent": key.agent,
            "scopes": key.scopes,
            "tenant": tenant.slug,
            "user": bool(key.user_id),
        }
    tool = policy.tool_input(*rng.choice(tools)) if tools else None
    return policy.trial_document(tenant=tenant.slug, principal=principal, tool=tool)


def _mcp_collision(name: str, other: str) -> dict[str, str]:
    return {
        "path": "/metadata/name",
        "message": f"its MCP name '{mcp_tool_name(name)}' is already the MCP name of '{other}'",
    }


def _refuse_mcp_collisions(tenant: Tenant, manifests: list[dict[str, Any]]) -> None:
    """ManifestInvalid when a tool would share its MCP name with another tool of the
    tenant (`jira.search` and `jira_search`): `/v1/mcp` could not tell them apart."""
    applied = [m["metadata"]["name"] for m in manifests if m["kind"] == "Tool"]
    if not applied:
        return
    taken: dict[str, str] = {}
    for existing in Tool.objects.for_tenant(tenant).values_list("name", flat=True):
        taken[mcp_tool_name(existing)] = existing
    errors = []
    for index, manifest in enumerate(manifests):
        name = manifest["metadata"]["name"]
        if manifest["kind"] != "Tool":
            continue
        other = taken.get(mcp_tool_name(name))
        if other is not None and other != name:
            errors.append({"manifest": _label(manifest, index), **_mcp_collision(name, other)})
    if errors:
        raise ManifestInvalid(errors)


def _label(document: Any, index: int) -> str:
    name = None
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict):
        name = document["metadata"].get("name")
    return f"{index}:{name}" if isinstance(name, str) else str(index)


def apply_manifests(
    *, tenant: Tenant, documents: list[Any], dry_run: bool = False, actor: str = ""
) -> list[ApplyResult]:
    """Validate then apply every manifest in one transaction (all or nothing)."""
    manifests = validate_manifests(documents, tenant=tenant)
    # Read before the transaction: no row lock is held across an upstream's answer.
    upstream = read_upstream_definitions(tenant, manifests)
    with tenant_scope(tenant):
        _refuse_mcp_collisions(tenant, manifests)
        _check_sandbox_profiles(tenant, manifests)
        results = [
            _apply_one(
                tenant,
                m,
                dry_run=dry_run,
                actor=actor,
                upstream=upstream.get(m["metadata"]["name"]) if m["kind"] == "Tool" else None,
            )
            for m in manifests
        ]
        if dry_run:
            transaction.set_rollback(True)
        else:
            audit.record(
                tenant,
                [
                    audit.Entry(
                        "manifest.apply",
                        actor or "system",
                        f"{r.kind.lower()}:{r.name}",
                        {
                            "kind": r.kind,
                            "name": r.name,
                            "version": r.version,
                            "status": r.status,
                            "revision": r.revision,
                            "digest": r.digest,
                            **({"mcp_pin": r.mcp_pin} if r.mcp_pin else {}),
                        },
                    )
                    for r in results
                    if r.status != "unchanged"
                ],
            )
    return results


def _check_sandbox_profiles(tenant: Tenant, manifests: list[dict[str, Any]]) -> None:
    """A sandbox tool's profile is built in, applied with it, or the tenant's already; a
    tenant's profile decides the tool's `spec.network` as a built-in one does (the
    catalog and policies read it: a `network: host` profile is `external`)."""
    batch = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "SandboxProfile"}
    errors = []
    for index, manifest in enumerate(manifests):
        if manifest["kind"] != "Tool" or manifest["spec"]["endpoint"]["type"] != "sandbox":
            continue
        name = manifest["spec"]["sandbox_profile"]
        if name in sandboxes.BUILTIN:
            continue
        profile = batch.get(name)
        if profile is None:
            version = (
                ManifestVersion.objects.for_tenant(tenant)
                .filter(kind="SandboxProfile", name=name)
                .order_by("-revision")
                .first()
            )
            profile = version.manifest if version else None
        if profile is not None:
            host = profile["spec"].get("network") == "host"
            manifest["spec"]["network"] = "external" if host else "none"
        else:
            errors.append(
                {
                    "manifest": _label(manifest, index),
                    "path": "/spec/sandbox_profile",
                    "message": f"no sandbox profile {name!r}: strict, egress or a SandboxProfile",
                }
            )
    if errors:
        raise ManifestInvalid(errors)


def read_upstream_definitions(
    tenant: Tenant, manifests: list[dict[str, Any]]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """For each `mcp` tool: the definition its server serves now and its pin
    (`sha256:` of the RFC 8785 JSON). A manifest `pin` that differs, a server that cannot
    be reached or has no such tool: 422, since a definition nobody has seen cannot be
    pinned (apply again once the server answers)."""
    from gateway import credentials, mcp_client
    from gateway.mcp_sync import Listings

    listings = Listings(tenant)
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    errors: list[dict[str, Any]] = []
    for index, manifest in enumerate(manifests):
        if manifest["kind"] != "Tool" or manifest["spec"]["endpoint"]["type"] != "mcp":
            continue
        label = _label(manifest, index)
        spec, endpoint = manifest["spec"], manifest["spec"]["endpoint"]
        reason = resolved_refusal(endpoint["url"])
        if reason:
            errors.append(
                {"manifest": label, "path": "/spec/endpoint/url", "message": f"forbidden: {reason}"}
            )
            continue
        try:
            definition = listings.definition(spec)
        except credentials.CredentialUnavailable:
            errors.append(
                {
                    "manifest": label,
                    "path": "/spec/credential_ref",
                    "message": "cannot be leased to read the tool's definition on its MCP "
                    "server (set the credential first)",
                }
            )
            continue
        except mcp_client.MCPCallError as exc:
            errors.append(
                {
                    "manifest": label,
                    "path": "/spec/endpoint/url",
                    "message": "the MCP server could not be read to pin the tool's definition "
                    f"({exc.code}); apply again once it answers",
                }
            )
            continue
        if definition is None:
            errors.append(
                {
                    "manifest": label,
                    "path": "/spec/endpoint/tool",
                    "message": f"the MCP server has no tool named {endpoint['tool'][:200]!r}",
                }
            )
            continue
        try:
            pin = mcp_client.definition_digest(definition)
        except mcp_client.MCPCallError:
            errors.append(
                {
                    "manifest": label,
                    "path": "/spec/endpoint/tool",
                    "message": mcp_client.UNCANONICAL,
                }
            )
            continue
        if endpoint.get("pin") and endpoint["pin"] != pin:
            errors.append(
                {
                    "manifest": label,
                    "path": "/spec/endpoint/pin",
                    "message": f"the MCP server's definition of this tool has digest {pin}, "
                    "not the pinned one: review it (manage.py mcp_discover) and update the pin",
                }
            )
            continue
        found[manifest["metadata"]["name"]] = (pin, definition)
    if errors:
        raise ManifestInvalid(errors)
    return found


def _apply_one(
    tenant: Tenant,
    manifest: dict[str, Any],
    *,
    dry_run: bool,
    actor: str,
    upstream: tuple[str, dict[str, Any]] | None = None,
) -> ApplyResult:
    kind, meta = manifest["kind"], manifest["metadata"]
    name, version = meta["name"], meta["version"]
    digest = manifest_digest(manifest)
    mcp_pin, mcp_definition = upstream or ("", None)
    latest = (
        ManifestVersion.objects.for_tenant(tenant)
        .select_for_update()
        .filter(kind=kind, name=name)
        .order_by("-revision")
        .first()
    )
    now = timezone.now()
    if latest is not None and latest.digest == digest and latest.mcp_pin == mcp_pin:
        if kind == "Tool" and mcp_pin:
            # The definition is back to the reviewed one and someone applied the manifest
            # again: that review reopens a tool a re-sync closed.
            drifted = Tool.objects.for_tenant(tenant).filter(name=name, mcp_drift__isnull=False)
            reopened = (
                drifted.exists() if dry_run else drifted.update(mcp_drift=None, updated_at=now)
            )
            if reopened:
                return ApplyResult(
                    kind, name, version, "updated", [], latest.revision, digest, mcp_pin
                )
        return ApplyResult(kind, name, version, "unchanged", [], latest.revision, digest, mcp_pin)
    changes = diff(latest.manifest if latest else {}, manifest)
    if latest is not None and kind == "Tool" and latest.mcp_pin != mcp_pin:
        changes.append(
            {
                "op": "replace",
                "path": "/upstream/definition_digest",
                "old": latest.mcp_pin or None,
                "value": mcp_pin or None,
            }
        )
    status = "updated" if latest else "created"
    revision = latest.revision + 1 if latest else 1
    if dry_run:
        return ApplyResult(kind, name, version, status, changes, revision, digest, mcp_pin)
    ManifestVersion.objects.create(
        tenant=tenant,
        kind=kind,
        name=name,
        version=version,
        revision=revision,
        manifest=manifest,
        digest=digest,
        diff=changes,
        mcp_pin=mcp_pin,
        mcp_definition=mcp_definition,
        applied_by=actor,
        created_at=now,
    )
    if kind == "Tool":
        Tool.objects.update_or_create(
            tenant=tenant,
            name=name,
            defaults={
                "version": version,
                "revision": revision,
                "manifest": manifest,
                "digest": digest,
                "mcp_pin": mcp_pin,
                "mcp_definition": mcp_definition,
                "mcp_drift": None,
                "updated_at": now,
            },
        )
    elif kind == "Policy":
        PolicyModule.objects.update_or_create(
            tenant=tenant,
            name=name,
            defaults={
                "version": version,
                "rego": manifest["spec"]["rego"],
                "digest": digest,
                "updated_at": now,
                # A new version is decided afresh: the old one's flag is not its own.
                "budget_exceeded_at": None,
                "budget_exceeded_reason": "",
            },
        )
    return ApplyResult(kind, name, version, status, changes, revision, digest, mcp_pin)
