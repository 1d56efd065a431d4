"""The invoke pipeline: the one place an agent's tool call is governed (SPEC §1).

Order: key (done by the caller) → idempotency → tool → input schema → policy →
[rate limit] → [DLP] → approval → [credential lease] → endpoint → output → cost → answer.
Bracketed steps are the seams later capabilities fill in here, nowhere else.

Transactions: nothing is held across the upstream call. A non-idempotent tool gets a
`running` claim committed before the call (so a crash leaves a trace, never a silent
second execution) and its result after; an idempotent tool is written once, after.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext_lazy as _
from jsonschema import Draft202012Validator
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from opentelemetry import trace
from referencing.exceptions import Unresolvable

from eai import bulkheads
from eai.errors import ApiError, Text, envelope, join_texts, render_message
from eai.integrations import otel
from eai.jsoncodec import answer_json, canonical_json
from eai.process_cache import ProcessCache
from gateway import audit, breakers, credentials, dlp, finops, metrics, policy, ratelimits
from gateway import sandbox as sandboxes
from gateway.contracts import (
    UnusablePattern,
    Validator,
    json_pointer,
    schema_errors,
    value_free_errors,
)
from gateway.endpoints import EndpointError, Vetted, call_endpoint, vet
from gateway.manifests import duration_seconds
from gateway.models import (
    RUN_ID_RE,
    ApprovalRequest,
    Artifact,
    Decision,
    IdempotencyRecord,
    Invocation,
    ManifestVersion,
    PolicyModule,
    Run,
    Tool,
    built,
    format_amount,
    new_id,
)
from gateway.sealing import keyed_digest, seal, unseal
from tenants.models import ApiKey
from tenants.scope import tenant_scope

logger = logging.getLogger(__name__)

BODY_FIELDS = {"input", "run_id", "step_index", "idempotency_key"}

IDEMPOTENCY_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}\Z")

STATUS_HTTP = {
    Invocation.SUCCEEDED: 200,
    Invocation.WAITING_APPROVAL: 202,
    Invocation.QUEUED: 202,
    Invocation.RUNNING: 202,
}
# The other final statuses' HTTP codes (SPEC §2), for answers rebuilt from the store.
SETTLED_HTTP = {
    Invocation.FAILED: 502,
    Invocation.DENIED: 403,
    Invocation.UNAVAILABLE: 503,
    Invocation.TIMED_OUT: 504,
    Invocation.CANCELLED: 409,
    Invocation.EXPIRED: 409,
}
IDEMPOTENCY_TTL = timedelta(hours=24)
# Codes not to replay for an Idempotency-Key: the client is meant to retry those.
NOT_STORED = {"rate_limited", "audit_unavailable", "idempotency_in_progress"}


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


@dataclass
class Outcome:
    """What the view answers: status, exact body bytes, extra headers."""

    status: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Call:
    """One parsed invoke request."""

    key: ApiKey
    tool_name: str
    input: dict[str, Any]
    run_id: str
    step_index: int | None
    request_id: str
    prefer_async: bool
    door: str = Invocation.REST  # how the call came in: REST invoke or MCP tools/call


class _Validators:
    """Compiled JSON Schema validators per tool manifest digest (bounded LRU)."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self.cache: OrderedDict[tuple[str, str], Draft202012Validator] = OrderedDict()

    def get(self, tool_digest: str, which: str, schema: dict[str, Any]) -> Draft202012Validator:
        cache_key = (tool_digest, which)
        validator = self.cache.get(cache_key)
        if validator is None:
            # The published meta-schemas and nothing else: jsonschema's default would
            # fetch any URL a `$ref` names (the metadata address included).
            validator = Validator(schema, registry=SPECIFICATIONS)
            self.cache[cache_key] = validator
            if len(self.cache) > self.size:
                self.cache.popitem(last=False)
        return validator


VALIDATORS = _Validators()


# ---------------------------------------------------------------------------- entry


def invoke(
    *,
    key: ApiKey,
    tool_name: str,
    body: Any,
    request: Any,
    idempotency_key: str | None = None,
    prefer_async: bool = False,
    door: str = Invocation.REST,
) -> Outcome:
    """Run one invoke request through the pipeline and return the answer to send.
    `door` records how it came in (`Invocation.REST` or `Invocation.MCP`)."""
    body_key = body.get("idempotency_key") if isinstance(body, dict) else None
    if body_key is not None:
        body_key = body_key if isinstance(body_key, str) else ""
        if idempotency_key is None:
            idempotency_key = body_key
        elif body_key != idempotency_key:
            # Which one did the caller mean? Neither is guessed.
            why = _("the Idempotency-Key header and the body's idempotency_key differ")
            return _error(request, ApiError("invalid_request", reason=Text(why)))
    if idempotency_key is None:
        return _answer_or_error(
            request, lambda: _invoke(key, tool_name, body, request, prefer_async, door)
        )
    if not IDEMPOTENCY_KEY_RE.match(idempotency_key):
        return _error(
            request,
            ApiError(
                "invalid_request",
                reason=Text(_("Idempotency-Key must be 1 to 255 visible ASCII characters")),
            ),
        )
    request_digest = digest({"tool": tool_name, "body": _without_key(body)})
    claim = _claim_idempotency(key, idempotency_key, tool_name, request_digest)
    if isinstance(claim, str):
        return _error(request, ApiError(claim))
    if isinstance(claim, Outcome):
        return claim
    written = _WRITTEN.set(None)
    claimed = _CLAIM.set(claim)
    try:
        outcome = _answer_or_error(
            request, lambda: _invoke(key, tool_name, body, request, prefer_async, door)
        )
        # A refusal not stored for replay (503 audit_unavailable) is kept all the same
        # once a row of the call was written: a non-idempotent call's running claim
        # precedes its upstream call, and a retry under the key must not run it again.
        keep = _WRITTEN.get() is not None
    except Exception:
        # The claim must not stay "in progress" for its 24 h. Before any row of the call
        # was written nothing ran (for a non-idempotent tool the `running` claim is
        # written before the upstream call): the key is released, a retry runs. After,
        # the upstream may have acted: the key keeps this 500, naming the invocation,
        # and a deliberate retry takes a new key.
        invocation_id = _WRITTEN.get()
        logger.exception("invoke of %s failed (invocation %s)", tool_name, invocation_id)
        error = ApiError(
            "internal_error", **({"invocation_id": invocation_id} if invocation_id else {})
        )
        outcome = _error(request, error)
        if invocation_id is None:
            _release_idempotency(key, claim)
            return outcome
        keep = True
    finally:
        _WRITTEN.reset(written)
        _CLAIM.reset(claimed)
    _complete_idempotency(key, claim, outcome, keep=keep)
    return outcome


def _without_key(body: Any) -> Any:
    if isinstance(body, dict) and "idempotency_key" in body:
        return {k: v for k, v in body.items() if k != "idempotency_key"}
    return body


def _answer_or_error(request: Any, run: Any) -> Outcome:
    try:
        return run()
    except ApiError as error:
        return _error(request, error)


def _error(request: Any, error: ApiError) -> Outcome:
    headers = dict(error.headers)
    return Outcome(error.status, answer_json(envelope(request, error)), headers)


# ------------------------------------------------------------------- idempotency


def _claim_idempotency(
    key: ApiKey, idem_key: str, tool_name: str, request_digest: str
) -> IdempotencyRecord | Outcome | str:
    """Insert the claim row; else the stored answer to replay, or the 409 code to send.

    Keys are kept IDEMPOTENCY_TTL: an older record no longer binds its key.
    """
    try:
        with tenant_scope(key.tenant):
            IdempotencyRecord.objects.for_tenant(key.tenant).filter(
                api_key_id=key.public_id,
                key=idem_key,
                created_at__lt=timezone.now() - IDEMPOTENCY_TTL,
            ).delete()
            return IdempotencyRecord.objects.create(
                tenant=key.tenant,
                api_key_id=key.public_id,
                key=idem_key,
                tool=tool_name,
                request_digest=request_digest,
            )
    except IntegrityError:
        pass
    with tenant_scope(key.tenant, readonly=True):
        record = (
            IdempotencyRecord.objects.for_tenant(key.tenant)
            .filter(api_key_id=key.public_id, key=idem_key)
            .first()
        )
    if record is None:  # the claim was released meanwhile; the client may retry
        return "idempotency_in_progress"
    if record.tool != tool_name or record.request_digest != request_digest:
        return "idempotency_conflict"
    if record.status_code is None:
        left = _left_behind(key, record)
        if left is None:
            return "idempotency_in_progress"
        if left == "abandoned":
            return _claim_idempotency(key, idem_key, tool_name, request_digest)
        record.status_code, record.response_body = left.status, left.content
    return Outcome(record.status_code, bytes(record.response_body), {"Idempotent-Replayed": "true"})


# An unanswered claim this old belongs to a process that died: past the longest call a
# tool may make (`timeout_ms` is at most 10 minutes) and the recovery sweep's grace.
def _claim_horizon() -> timedelta:
    return timedelta(seconds=600 + settings.EAI_STUCK_GRACE_S)


def _left_behind(key: ApiKey, record: IdempotencyRecord) -> Outcome | str | None:
    """For a claim still unanswered: its call's outcome when a dead process left it and
    the recovery sweep has settled it (stored now for later replays); "abandoned" when
    the process died before its call could act (the claim is dropped, the retry runs);
    None while the call may still be in flight."""
    invocation = None
    if record.invocation_id:
        with tenant_scope(key.tenant, readonly=True):
            invocation = (
                Invocation.objects.for_tenant(key.tenant)
                .filter(pk=record.invocation_id)
                .select_related("tenant")
                .first()
            )
    if invocation is not None:
        if invocation.status == Invocation.RUNNING:
            return None  # in flight, or left for the recovery sweep to settle
        # Final, or queued / waiting for approval: what the first answer was (202) or
        # would have been.
        outcome = _settled_outcome(invocation)
        with tenant_scope(key.tenant):
            IdempotencyRecord.objects.for_tenant(key.tenant).filter(
                pk=record.pk, status_code__isnull=True
            ).update(status_code=outcome.status, response_body=outcome.content)
        return outcome
    if record.created_at > timezone.now() - _claim_horizon():
        return None
    # Nothing was run under it: a non-idempotent call names its invocation here before
    # its `running` row is written, and that row before the upstream call (no such row:
    # no call); an idempotent one may be repeated.
    with tenant_scope(key.tenant):
        dropped, _by_model = (
            IdempotencyRecord.objects.for_tenant(key.tenant)
            .filter(pk=record.pk, status_code__isnull=True, invocation_id=record.invocation_id)
            .delete()
        )
    return "abandoned" if dropped else None


def _settled_outcome(invocation: Invocation) -> Outcome:
    """The answer the first request would have given, for a call settled without it (a
    dead process's call, failed `worker_lost` by the sweep): the invocation's shape when
    2xx, else the envelope of its stored error (English: no request to follow)."""
    status = STATUS_HTTP.get(invocation.status)
    if status is not None:
        return Outcome(status, answer_json(invocation.as_dict()))
    error = invocation.error or {"code": "internal_error", "message": ""}
    message = error.get("message") or render_message("internal_error", {}, "en")
    body = {
        "error": {
            "code": error.get("code", "internal_error"),
            "message": message,
            "message_i18n": {"en": message, "fr": message},
            "details": {},
            "request_id": invocation.request_id or None,
            "decision_id": invocation.decision_id,
            "invocation_id": invocation.id,
        }
    }
    return Outcome(SETTLED_HTTP.get(invocation.status, 500), answer_json(body))


def purge_idempotency_records(tenant: Any) -> int:
    """Delete the tenant's idempotency records older than IDEMPOTENCY_TTL."""
    with tenant_scope(tenant):
        deleted, _by_model = (
            IdempotencyRecord.objects.for_tenant(tenant)
            .filter(created_at__lt=timezone.now() - IDEMPOTENCY_TTL)
            .delete()
        )
    return deleted


# The invocation whose rows this request wrote last (None: nothing written yet).
_WRITTEN: ContextVar[str | None] = ContextVar("eai_written_invocation", default=None)
# This request's Idempotency-Key claim (None: no key).
_CLAIM: ContextVar[IdempotencyRecord | None] = ContextVar("eai_idempotency_claim", default=None)


def _release_idempotency(key: ApiKey, record: IdempotencyRecord) -> None:
    with tenant_scope(key.tenant):
        IdempotencyRecord.objects.for_tenant(key.tenant).filter(pk=record.pk).delete()


def _complete_idempotency(
    key: ApiKey, record: IdempotencyRecord, outcome: Outcome, *, keep: bool = False
) -> None:
    """Store the answer for replays, or release the claim when it must not be replayed,
    unless `keep` (a row of the call was written: the answer is stored all the same)."""
    code, retryable = None, False
    if outcome.status >= 400:
        error = json.loads(outcome.content).get("error", {})
        code, retryable = error.get("code"), error.get("details", {}).get("retryable") is True
    with tenant_scope(key.tenant):
        rows = IdempotencyRecord.objects.for_tenant(key.tenant).filter(pk=record.pk)
        if (code in NOT_STORED or retryable) and not keep:
            rows.delete()
        else:
            rows.update(status_code=outcome.status, response_body=outcome.content)


# ------------------------------------------------------------------------ steps


def _parse(
    key: ApiKey, tool_name: str, body: Any, request: Any, prefer_async: bool, door: str
) -> Call:
    if not isinstance(body, dict):
        raise ApiError("invalid_request", reason=Text(_("the body must be a JSON object")))
    unknown = sorted(set(body) - BODY_FIELDS)
    if unknown:
        raise ApiError(
            "invalid_request",
            reason=Text(_("unknown fields: %(fields)s"), fields=", ".join(unknown)[:300]),
            details={"unknown_fields": unknown[:50]},
        )
    if "input" not in body:
        raise ApiError(
            "invalid_input",
            details={"errors": [{"path": "", "message": "'input' is required"}]},
        )
    tool_input = body["input"]
    if not isinstance(tool_input, dict):
        raise ApiError(
            "invalid_input",
            details={"errors": [{"path": "", "message": "'input' must be a JSON object"}]},
        )
    run_id = body.get("run_id")
    if run_id is not None and (not isinstance(run_id, str) or not RUN_ID_RE.match(run_id)):
        raise ApiError(
            "invalid_request",
            reason=Text(
                _("run_id must be a string of 1 to 200 letters, digits, '_', '.', ':' or '-'")
            ),
            details={"field": "run_id"},
        )
    step = body.get("step_index")
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**31
    ):
        raise ApiError(
            "invalid_request",
            reason=Text(_("step_index must be a non-negative integer")),
            details={"field": "step_index"},
        )
    return Call(
        key=key,
        tool_name=tool_name,
        input=tool_input,
        run_id=run_id or "",
        step_index=step,
        request_id=getattr(request, "request_id", ""),
        prefer_async=prefer_async,
        door=door,
    )


def _resolve(call: Call) -> tuple[Tool, list[tuple[str, str]]]:
    tool, modules = _read_tool(call.key.tenant, call.tool_name)
    if tool is None:
        raise ApiError("tool_not_found", tool=dlp.scrub_text(call.tool_name)[0][:200])
    if tool.disabled:
        raise ApiError("tool_unavailable", reason=Text(_("the tool is disabled")))
    if tool.mcp_drift:
        raise ApiError("tool_unavailable", reason=DEFINITION_CHANGED)
    return tool, modules


DEFINITION_CHANGED = Text(
    _("its definition changed on its MCP server; it reopens when its manifest is applied again")
)


# Tools and policy modules as last read, per process, for TOOL_CACHE_S: the catalog
# changes rarely and is read on every call. Applying a manifest or flipping `disabled`
# in this process forgets them at once; another process sees the change at most
# TOOL_CACHE_S late (each invocation stores the tool revision that ran). Unknown tools
# are not cached, so a newly applied tool is usable at once everywhere.
TOOL_CACHE_S = 1.0
_tool_cache: ProcessCache[tuple[Tool | None, list[tuple[str, str]]]] = ProcessCache(
    TOOL_CACHE_S, keep=lambda found: found[0] is not None
)


def forget_cached_tools(**kwargs: Any) -> None:
    """Drop every cached tool (a tool or policy module changed in this process), now
    and again at commit: a call in another thread may re-read the old row meanwhile."""
    _tool_cache.clear()
    transaction.on_commit(_tool_cache.clear)


def read_tool(tenant: Any, name: str) -> Tool | None:
    """The tenant's tool `name` as the pipeline reads it (kept TOOL_CACHE_S), or None."""
    return _read_tool(tenant, name)[0]


def _read_tool(tenant: Any, name: str) -> tuple[Tool | None, list[tuple[str, str]]]:
    return _tool_cache.get((tenant.pk, name), lambda _key: _read_tool_now(tenant, name))


def _read_tool_now(tenant: Any, name: str) -> tuple[Tool | None, list[tuple[str, str]]]:
    """The tool and the tenant's policy modules: one round trip on PostgreSQL
    (`eai_resolve_tool`), a read-only scope elsewhere."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT eai_resolve_tool(%s::uuid, %s)", [str(tenant.pk), name])
            found = cursor.fetchone()[0]
        if isinstance(found, str):
            found = json.loads(found)
        modules = [(m[0], m[1]) for m in found["modules"]]
        row = found["tool"]
        if row is None:
            return None, modules
        tool = Tool(
            id=row["id"],
            tenant=tenant,
            name=row["name"],
            version=row["version"],
            revision=row["revision"],
            manifest=row["manifest"],
            digest=row["digest"],
            disabled=row["disabled"],
            mcp_pin=row.get("mcp_pin") or "",
            mcp_definition=row.get("mcp_definition"),
            mcp_drift=row.get("mcp_drift"),
            created_at=parse_datetime(row["created_at"]),
            updated_at=parse_datetime(row["updated_at"]),
        )
        return tool, modules
    with tenant_scope(tenant, readonly=True):
        tool = Tool.objects.for_tenant(tenant).filter(name=name).first()
        modules = list(
            PolicyModule.objects.for_tenant(tenant).order_by("name").values_list("name", "rego")
        )
    return tool, modules


def _validate_input(call: Call, tool: Tool) -> None:
    validator = VALIDATORS.get(tool.digest, "input", tool.spec["input_schema"])
    try:
        # Longer than shown: masked first, then cut (a value cut first could show the
        # half of itself before the cut, unrecognised).
        errors = schema_errors(validator, call.input, bound=4096)
    except Unresolvable as exc:  # a ref apply could not check (under a relative $id)
        reason = Text(_("its input schema refers to a schema that cannot be resolved"))
        raise ApiError("tool_unavailable", reason=reason) from exc
    except UnusablePattern as exc:  # stored before apply refused such patterns
        reason = Text(_("its input schema has a pattern this gateway cannot run"))
        raise ApiError("tool_unavailable", reason=reason) from exc
    except RecursionError as exc:  # `$ref`s that lead back to themselves
        reason = Text(_("its input schema refers to itself without end"))
        raise ApiError("tool_unavailable", reason=reason) from exc
    if errors:
        # Messages quote the offending values (with Python's repr, which writes a
        # no-break space as \xa0): they must not echo personal data back.
        for item in errors[:100]:
            item["message"] = item["message"].replace("\\xa0", "\xa0").replace("\\u202f", "\u202f")
            item["path"] = _masked_pointer(item["path"])
        clean, _counts = dlp.scrub(errors[:100])
        for item in clean:
            item["message"] = item["message"][:500]
        raise ApiError("invalid_input", details={"errors": clean})


def _masked_pointer(pointer: str) -> str:
    """A JSON pointer with each of its names masked as names: its escapes (`~1` for a
    `/`) would glue a digit to a value ("/x~1FR76…") and hide it from the detector."""
    if "~" not in pointer:
        return pointer  # masked with the message, as it stands
    names = [n.replace("~1", "/").replace("~0", "~") for n in pointer.split("/")[1:]]
    return json_pointer([dlp.scrub_text(n)[0] for n in names])


def _policy_document(call: Call, tool: Tool) -> dict[str, Any]:
    return {
        # The same two parts the MCP tools/list filters on (`policy.missing_scopes`), so
        # a listed tool and a callable one are decided on identical facts.
        "principal": policy.principal_input(call.key),
        "tool": policy.tool_input(tool.name, tool.version, tool.spec),
        "request": {
            "run_id": call.run_id or None,
            "step_index": call.step_index,
            "input_digest": keyed_digest(call.input),
        },
        "context": {"request_id": call.request_id, "time": timezone.now().isoformat()},
    }


def _decide(call: Call, tool: Tool, modules: list[tuple[str, str]]) -> Decision:
    document = _policy_document(call, tool)
    try:
        result, version = policy.evaluate(document, modules, tenant=str(call.key.tenant_id))
    except policy.PolicyBusy:
        # Nothing was decided: the tenant already holds its share of the evaluators.
        raise ApiError("rate_limited", retry_after=1, headers={"Retry-After": "1"}) from None
    except policy.PolicyBudgetExceeded as exc:
        # Fail closed, and tell staff which modules (this version of them) did it; the
        # next call is decided under the budget again, with whatever is current then.
        logger.warning("policy modules of tenant %s: %s", call.key.tenant_id, exc)
        result = policy.PolicyResult(allow=False, reasons=[str(exc)], obligations=[])
        version = exc.version
        if exc.kind != "time":  # a wait past its bound may be the machine's, not theirs
            with tenant_scope(call.key.tenant):
                PolicyModule.objects.for_tenant(call.key.tenant).flag_budget_exceeded(
                    modules, str(exc)
                )
    except policy.PolicyError as exc:
        # Fail closed: a policy that cannot be evaluated denies. The decision keeps the
        # engine's words; the caller reads a translated reason (_deny_reason).
        logger.warning("policy of tenant %s failed: %s", call.key.tenant_id, exc)
        result = policy.PolicyResult(allow=False, reasons=[f"policy error: {exc}"], obligations=[])
        version = "error"
    decision = built(
        Decision,
        id=new_id("dec"),
        tenant=call.key.tenant,
        tool=tool.name,
        tool_version=tool.version,
        allow=result.allow,
        reasons=result.reasons,
        obligations=result.obligations,
        policy_version=version,
        input_digest=document["request"]["input_digest"],
        api_key_id=call.key.public_id,
        agent=call.key.agent,
    )
    decision.missing_scopes = result.missing_scopes  # for the message; not stored
    return decision


def _deny_reason(decision: Decision) -> Any:
    missing = getattr(decision, "missing_scopes", []) or []
    parts: list[Any] = [Text(_("missing scope '%(scope)s'"), scope=scope) for scope in missing]
    parts += [
        Text(_("the policy cannot be evaluated"))
        if r.startswith("policy error: ")
        else _budget_reason(r) or r
        for r in decision.reasons
        if not r.startswith("missing scope ")
    ]
    if not parts:
        parts = [Text(_("no rule allows this call"))]
    return join_texts(parts)


_BUDGET_RE = re.compile(
    re.escape(policy.BUDGET_REASON) + r"([0-9]+) (ms of CPU|MiB of memory|s of waiting) "
)


def _budget_reason(reason: str) -> Any:
    """The translated words for a reason policy.PolicyBudgetExceeded stored, or None."""
    match = _BUDGET_RE.match(reason)
    if match is None:
        return None
    amount, unit = match.groups()
    if unit == "ms of CPU":
        text = _("the tenant's policy modules used more than %(amount)s ms of CPU in a decision")
    elif unit == "MiB of memory":
        text = _(
            "the tenant's policy modules used more than %(amount)s MiB of memory in a decision"
        )
    else:
        text = _("the tenant's policy modules did not decide within %(amount)s s")
    return Text(text, amount=amount)


_AMOUNT_RE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?\Z")


def _over_max_cost(obligations: list[dict[str, Any]], cost: dict[str, Any]) -> Any:
    """Why the call's cost breaks a `max_cost` obligation (`{"type": "max_cost",
    "amount": "1.00", "currency": "EUR"}`; the currency may be left out), else None.
    A cap that cannot be read, or is in another currency than the tool's cost, denies:
    an obligation the gateway cannot honour is not waved through."""
    for obligation in obligations:
        if obligation.get("type") != "max_cost":
            continue
        amount, currency = Decimal(cost["amount"]), cost["currency"]
        raw = obligation.get("amount")
        # Written as amounts are (never 1e-999999999, which formats to a gigabyte).
        if isinstance(raw, bool) or not _AMOUNT_RE.match(str(raw)):
            return Text(_("its max_cost obligation has no readable amount"))
        cap = Decimal(str(raw))
        cap_currency = obligation.get("currency", currency)
        if cap_currency != currency or amount > cap:
            return Text(
                _("the call costs %(amount)s %(currency)s, over max_cost %(cap)s %(cap_currency)s"),
                amount=format_amount(amount),
                currency=currency,
                cap=format_amount(cap),
                cap_currency=str(cap_currency)[:8],
            )
    return None


def _new_invocation(call: Call, tool: Tool, decision: Decision, status: str) -> Invocation:
    invocation = built(
        Invocation,
        id=new_id("tinv"),
        tenant=call.key.tenant,
        tool=tool.name,
        tool_version=tool.version,
        tool_revision=tool.revision,
        status=status,
        input=call.input,
        decision=decision,
        run_id=call.run_id,
        step_index=call.step_index,
        api_key_id=call.key.public_id,
        agent=call.key.agent,
        request_id=call.request_id,
        door=call.door,
    )
    invocation.pending_audit = []  # audit entries to write with the next state change
    return invocation


def _save_all(
    call: Call,
    decision: Decision,
    invocation: Invocation,
    *extra: Any,
    events: list[str],
    finished: bool = False,
) -> None:
    """Write the decision, the invocation, its run, extra rows, their audit entries and
    feed events in one transaction. A failed audit write fails the whole write."""
    entries = [_decision_entry(decision, call.door), *invocation.pending_audit]
    entries += [_approval_entry(row) for row in extra if isinstance(row, ApprovalRequest)]
    if finished:
        entries.append(invoke_entry(invocation))
    invocation.pending_audit = []
    tenant = call.key.tenant
    rows: list[tuple[Any, bool]] = []
    if call.run_id:
        rows.append((Run(tenant=tenant, run_id=call.run_id, agent=call.key.agent), True))
    rows += [(decision, False), (invocation, False)]
    rows += [(row, False) for row in extra]
    artifact = getattr(invocation, "_artifact", None)
    if artifact is not None:
        rows.append((artifact, False))
    usage = finops.usage_for(invocation) if finished else None
    if usage is not None:
        rows.append((usage, False))
    claim = _CLAIM.get()
    if claim is not None and claim.invocation_id != invocation.id:
        # Named first: a process dying between the two writes leaves a claim naming no
        # row (nothing ran, nothing will), never a call its claim does not name (one
        # running, queued or waiting for approval, which a retry must not make again).
        with tenant_scope(tenant):
            named = (
                IdempotencyRecord.objects.for_tenant(tenant)
                .filter(pk=claim.pk, status_code__isnull=True)
                .update(invocation_id=invocation.id)
            )
        if not named:  # a retry took the key over (this request stalled past the horizon)
            raise ApiError("idempotency_in_progress")
        claim.invocation_id = invocation.id
    _record(
        tenant, rows, entries, [agent_event(kind, invocation) for kind in events], invocation.id
    )
    _WRITTEN.set(invocation.id)


def _save_decision(call: Call, decision: Decision, *entries: audit.Entry) -> None:
    """Store a decision that no invocation follows, with its audit entry and `entries`,
    in one transaction."""
    rows = [(decision, False)]
    _record(
        call.key.tenant, rows, [_decision_entry(decision, call.door), *entries], [], decision.id
    )


def _record(tenant: Any, rows: list, entries: list, events: list, ref: str) -> None:
    """`audit.record_with_rows`, failing closed: a write that fails answers 503
    `audit_unavailable` and nothing of it is kept."""
    try:
        audit.record_with_rows(tenant, rows, entries, events)
    except DatabaseError as exc:
        logger.exception("audit write failed for %s", ref)
        raise ApiError("audit_unavailable") from exc


def _decision_entry(decision: Decision, door: str) -> audit.Entry:
    return audit.Entry(
        "policy.decision",
        decision.api_key_id,
        decision.id,
        {
            "decision_id": decision.id,
            "action": decision.action,
            "tool": decision.tool,
            "tool_version": decision.tool_version,
            "allow": decision.allow,
            "reasons": decision.reasons,
            "obligations": decision.obligations,
            "policy_version": decision.policy_version,
            "input_digest": decision.input_digest,
            "door": door,
        },
    )


def _approval_entry(approval: ApprovalRequest) -> audit.Entry:
    return audit.Entry(
        "approval.requested",
        approval.requested_by_key,
        approval.id,
        {
            "approval_id": approval.id,
            "invocation_id": approval.invocation_id,
            "decision_id": approval.decision_id,
            "input_digest": approval.input_digest,
            "policy_version": approval.policy_version,
            "min_approvers": approval.min_approvers,
            "expires_at": approval.expires_at.isoformat(),
        },
    )


def invoke_entry(invocation: Invocation) -> audit.Entry:
    error = invocation.error or {}
    return audit.Entry(
        "tool.invoke",
        invocation.api_key_id,
        invocation.id,
        {
            "invocation_id": invocation.id,
            "tool": invocation.tool,
            "tool_version": invocation.tool_version,
            "status": invocation.status,
            "error_code": error.get("code"),
            "decision_id": invocation.decision_id,
            "approval_id": invocation.approval_id or None,
            "run_id": invocation.run_id or None,
            "step_index": invocation.step_index,
            "cost": _cost(invocation),
            "output_digest": digest(invocation.output) if invocation.output is not None else None,
            "door": invocation.door,
        },
    )


def _cost(invocation: Invocation) -> dict[str, str] | None:
    if invocation.cost_amount is None:
        return None
    return {"amount": format_amount(invocation.cost_amount), "currency": invocation.cost_currency}


def agent_event(kind: str, invocation: Invocation) -> audit.AgentEvent:
    """A feed event about `invocation`; payloads carry only stored (masked) data."""
    payload: dict[str, Any] = {"tool": invocation.tool, "tool_version": invocation.tool_version}
    if kind == "agent.tool.requested":
        payload.update(input=invocation.input, step_index=invocation.step_index)
    elif kind == "agent.tool.completed":
        payload.update(status=invocation.status, output=invocation.output, cost=_cost(invocation))
    elif kind == "agent.error":
        payload.update(status=invocation.status, error=invocation.error)
    elif kind == "agent.authorization.required":
        payload.update(approval_id=invocation.approval_id)
    refs = {"decision_id": invocation.decision_id}
    if invocation.approval_id:
        refs["approval_id"] = invocation.approval_id
    return audit.AgentEvent(
        kind,
        run_id=invocation.run_id,
        invocation_id=invocation.id,
        refs=refs,
        payload=payload,
    )


def _outcome_event(invocation: Invocation) -> str:
    if invocation.status == Invocation.SUCCEEDED:
        return "agent.tool.completed"
    return "agent.error"


@dataclass(frozen=True)
class DlpPlan:
    """What DLP does for one call: the manifest's `spec.dlp`, tightened by obligations.

    Actions: `mask` and `redact` scrub what is stored and what is sent; `block` refuses
    a call carrying a finding; `allow` (input only) stores and shows the input masked
    but sends it upstream unaltered, for tools that need the real value (a payment's
    IBAN). The stored copy is always scrubbed, whatever the action.
    """

    input: str
    output: str
    entities: frozenset[str]
    redact_fields: frozenset[str] = frozenset()
    secrets: tuple[str, ...] = ()  # exact credential values held by the gateway


_STRICTNESS = {"allow": 0, "mask": 1, "redact": 2, "block": 3}


def dlp_plan(
    spec: dict[str, Any], obligations: list[dict[str, Any]], secrets: tuple[str, ...] = ()
) -> DlpPlan:
    conf = spec.get("dlp") or {}
    actions = {"input": conf.get("input", "mask"), "output": conf.get("output", "mask")}
    entities = set(conf.get("entities") or dlp.ENTITIES)
    fields: set[str] = set()
    for obligation in obligations:
        kind = obligation.get("type")
        if kind == "dlp":
            entities |= {e for e in obligation.get("entities", []) if e in dlp.ENTITIES}
            action = obligation.get("action")
            for where in ("input", "output"):
                if action in _STRICTNESS and _STRICTNESS[action] > _STRICTNESS[actions[where]]:
                    actions[where] = action
        elif kind == "redact_fields":
            fields |= {str(f) for f in obligation.get("fields", [])}
    return DlpPlan(
        actions["input"], actions["output"], frozenset(entities), frozenset(fields), secrets
    )


def _redact_fields(value: Any, fields: frozenset[str]) -> Any:
    if not fields:
        return value
    if isinstance(value, dict):
        return {
            k: "[REDACTED]" if k in fields else _redact_fields(v, fields) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact_fields(v, fields) for v in value]
    return value


def _scrub(
    invocation: Invocation, value: Any, plan: DlpPlan, where: str
) -> tuple[Any, dict[str, int]]:
    """Scrub `value` for storage; note the redactions and their `dlp.redact` entry."""
    action = plan.input if where == "input" else plan.output
    clean, counts = dlp.scrub(
        value,
        action="redact" if action == "redact" else "mask",
        entities=plan.entities | {"SECRET"} if plan.secrets else plan.entities,
        secrets=plan.secrets,
    )
    clean = _redact_fields(clean, plan.redact_fields)
    if counts:
        invocation.redactions = [r for r in invocation.redactions if r["where"] != where] + [
            {"entity": e, "count": n, "where": where} for e, n in sorted(counts.items())
        ]
        invocation.pending_audit.append(
            audit.Entry(
                "dlp.redact",
                invocation.api_key_id,
                invocation.id,
                {
                    "invocation_id": invocation.id,
                    "where": where,
                    "action": action,
                    "entities": dict(sorted(counts.items())),
                },
            )
        )
    return clean, counts


def _invoke(
    key: ApiKey, tool_name: str, body: Any, request: Any, prefer_async: bool, door: str
) -> Outcome:
    span_name = f"execute_tool {tool_name}"[:200]
    context = otel.extract(getattr(request, "META", None))
    with otel.tracer().start_as_current_span(span_name, context=context) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool_name[:200],
                    "gen_ai.agent.id": key.agent or key.public_id,
                    "eai.tenant_id": key.tenant.public_id,
                    "eai.api_key_id": key.public_id,
                    "eai.door": door,
                }
            )
            if isinstance(body, dict) and isinstance(body.get("run_id"), str):
                span.set_attribute("eai.run_id", body["run_id"][:200])
        outcome, limit = _governed_call(key, tool_name, body, request, prefer_async, door)
        if span.is_recording():
            span.set_attribute("http.response.status_code", outcome.status)
            if outcome.status >= 400:
                span.set_status(trace.StatusCode.ERROR)
    if limit is not None:
        outcome.headers.update(limit.headers())
    return outcome


def _governed_call(
    key: ApiKey, tool_name: str, body: Any, request: Any, prefer_async: bool, door: str
) -> tuple[Outcome, ratelimits.Verdict | None]:
    call = _parse(key, tool_name, body, request, prefer_async, door)
    tool, modules = _resolve(call)
    _validate_input(call, tool)
    decision = _decide(call, tool, modules)
    requested = "agent.tool.requested"
    plan = dlp_plan(
        tool.spec,
        decision.obligations if decision.allow else [],
        tuple(credentials.known_secrets(key.tenant)),
    )
    if not decision.allow:
        invocation = _new_invocation(call, tool, decision, Invocation.DENIED)
        invocation.input, _counts = _scrub(invocation, call.input, plan, "input")
        error = ApiError(
            "policy_denied",
            reason=_deny_reason(decision),
            details={"reasons": decision.reasons},
            decision_id=decision.id,
            invocation_id=invocation.id,
        )
        _finish_fields(invocation, Invocation.DENIED, error=error)
        _save_all(call, decision, invocation, events=[requested, "agent.error"], finished=True)
        raise error
    spec = tool.spec
    over_cap = _over_max_cost(decision.obligations, spec["cost"])
    if over_cap is not None:  # before the rate limit: a refused call spends no token
        invocation = _new_invocation(call, tool, decision, Invocation.DENIED)
        invocation.input, _counts = _scrub(invocation, call.input, plan, "input")
        error = ApiError(
            "policy_denied",
            reason=over_cap,
            details={"obligation": "max_cost"},
            decision_id=decision.id,
            invocation_id=invocation.id,
        )
        _finish_fields(invocation, Invocation.DENIED, error=error)
        _save_all(call, decision, invocation, events=[requested, "agent.error"], finished=True)
        raise error
    try:
        limit = ratelimits.check(
            spec.get("rate_limit"),
            tenant_id=str(key.tenant_id),
            tool=tool.name,
            key_id=key.public_id,
            run_id=call.run_id,
        )
    except ratelimits.StoreUnreachable:
        # A limit that cannot be counted is not waived (it protects the upstream): the
        # call is refused as unavailable, its decision stored and chained with why.
        logger.exception("rate limit store unreachable for %s", tool.name)
        refusal = audit.Entry(
            "tool.rate_limit_unavailable",
            call.key.public_id,
            decision.id,
            {"decision_id": decision.id, "tool": tool.name, "run_id": call.run_id or None},
        )
        _save_decision(call, decision, refusal)
        raise ApiError(
            "tool_unavailable",
            reason=Text(_("its rate limit cannot be counted (the shared store is unreachable)")),
            details={"retryable": True},  # nothing ran: not kept for an Idempotency-Key
            decision_id=decision.id,
        ) from None
    if limit is not None and not limit.allowed:
        # The policy has decided by now: like every decision, this one is stored and
        # chained, with the refusal that followed it (no invocation: nothing ran), and
        # the answer names it.
        retry_after = max(1, limit.reset_after)
        refusal = audit.Entry(
            "tool.rate_limited",
            call.key.public_id,
            decision.id,
            {
                "decision_id": decision.id,
                "tool": tool.name,
                "rate_limit": spec.get("rate_limit"),
                "retry_after": retry_after,
                "run_id": call.run_id or None,
            },
        )
        _save_decision(call, decision, refusal)
        raise ApiError(
            "rate_limited",
            retry_after=retry_after,
            headers=limit.headers(),
            decision_id=decision.id,
        )
    needs_approval = spec["requires_approval"] or any(
        o.get("type") == "require_approval" for o in decision.obligations
    )
    if call.prefer_async and not needs_approval and _queue_full(key.tenant):
        # A tenant's queued calls wait in one queue with every tenant's (the broker's, or
        # this process's pool): past its share, a flood of them would hold another
        # tenant's call behind it. Stored and chained like every refusal after a decision.
        refusal = audit.Entry(
            "tool.queue_full",
            call.key.public_id,
            decision.id,
            {
                "decision_id": decision.id,
                "tool": tool.name,
                "queued_max": settings.EAI_TENANT_QUEUED_MAX,
                "run_id": call.run_id or None,
            },
        )
        _save_decision(call, decision, refusal)
        raise ApiError(
            "rate_limited",
            retry_after=QUEUE_RETRY_AFTER_S,
            headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)},
            decision_id=decision.id,
        )
    invocation = _new_invocation(call, tool, decision, Invocation.RUNNING)
    invocation.input, found = _scrub(invocation, call.input, plan, "input")
    # A call parked for approval reserves when it runs (it may wait for days): here it
    # is only read against the budget.
    error = _budget_refusal(key.tenant, spec, invocation, reserve=not needs_approval)
    if error is not None:
        _finish_fields(invocation, Invocation.DENIED, error=error)
        _save_all(call, decision, invocation, events=[requested, "agent.error"], finished=True)
        raise error
    try:
        outcome = _admitted_call(
            call, request, tool, decision, invocation, plan, found, needs_approval
        )
        return outcome, limit
    except BaseException:
        # A final status written releases the hold (a trigger); a call that ends without
        # one (its write failed: 503) gives it back here rather than at the sweep.
        if not needs_approval:
            _release_quietly(key.tenant, invocation.id)
        raise


def _release_quietly(tenant: Any, invocation_id: str) -> None:
    try:
        finops.release(tenant, invocation_id)
    except DatabaseError:  # the recovery sweep releases it later
        logger.exception("budget hold of %s not released", invocation_id)


def _admitted_call(
    call: Call,
    request: Any,
    tool: Tool,
    decision: Decision,
    invocation: Invocation,
    plan: DlpPlan,
    found: dict[str, int],
    needs_approval: bool,
) -> Outcome:
    """The rest of an admitted call (its budget reserved): DLP block, approval, queue,
    or run now."""
    spec = tool.spec
    requested = "agent.tool.requested"
    if plan.input == "block" and found:
        error = ApiError(
            "dlp_blocked",
            entities=", ".join(sorted(found)),
            where=Text(_("the input")),
            details={"entities": sorted(found), "where": "input"},
            decision_id=decision.id,
            invocation_id=invocation.id,
        )
        _finish_fields(invocation, Invocation.DENIED, error=error)
        _save_all(call, decision, invocation, events=[requested, "agent.error"], finished=True)
        raise error
    # What goes upstream: the scrubbed input, or the raw one when the tool needs it.
    upstream_input = call.input if plan.input == "allow" else invocation.input
    if needs_approval:
        invocation.status = Invocation.WAITING_APPROVAL
        invocation.sealed_input = seal(upstream_input)
        approval = _approval_request(call, tool, decision, invocation)
        invocation.approval_id = approval.id
        _save_all(
            call,
            decision,
            invocation,
            approval,
            events=[requested, "agent.authorization.required"],
        )
        return _invocation_outcome(request, invocation)
    if call.prefer_async:
        invocation.status = Invocation.QUEUED
        invocation.sealed_input = seal(upstream_input)
        with tenant_scope(call.key.tenant):
            _save_all(call, decision, invocation, events=[requested])
            enqueue_execution(invocation.id, call.key.tenant)
        return _invocation_outcome(request, invocation)
    invocation.started_at = timezone.now()
    if spec["idempotent"]:
        # Written once, after the call: a crash before the write loses nothing that
        # cannot be repeated safely.
        _execute(invocation, spec, upstream_input, plan)
        _save_all(
            call,
            decision,
            invocation,
            events=[requested, "agent.tool.started", _outcome_event(invocation)],
            finished=True,
        )
    else:
        _save_all(call, decision, invocation, events=[requested, "agent.tool.started"])
        _execute(invocation, spec, upstream_input, plan)
        _store_result(invocation)
    return _invocation_outcome(request, invocation)


def _budget_refusal(
    tenant: Any, spec: dict[str, Any], invocation: Invocation, *, reserve: bool = True
) -> ApiError | None:
    """Reserve the call's cost on the tenant's monthly budget (or, not `reserve`, only
    check that it fits now); 403 `budget_exceeded` when it does not."""
    cost = Decimal(spec["cost"]["amount"])
    try:
        if reserve:
            finops.reserve(tenant, invocation.id, cost)
        elif finops.over_budget(tenant, cost):
            budget, currency = finops.budget_of(tenant)
            raise finops.BudgetExceeded(budget, currency)
    except finops.BudgetExceeded as exceeded:
        return ApiError(
            "budget_exceeded",
            budget=format_amount(exceeded.budget),
            currency=exceeded.currency,
            decision_id=invocation.decision_id,
            invocation_id=invocation.id,
        )
    return None


def _approval_request(
    call: Call, tool: Tool, decision: Decision, invocation: Invocation
) -> ApprovalRequest:
    approval_spec = tool.spec["approval"]
    now = timezone.now()
    return ApprovalRequest(
        id=new_id("apr"),
        tenant=call.key.tenant,
        invocation=invocation,
        tool=tool.name,
        risk_class=tool.spec["risk_class"],
        input_digest=decision.input_digest,
        decision=decision,
        policy_version=decision.policy_version,
        min_approvers=approval_spec["min_approvers"],
        requested_by_key=call.key.public_id,
        requested_by_users=sorted(
            {u for u in (call.key.user_id, call.key.created_by_id) if u is not None}
        ),
        expires_at=now + timedelta(seconds=duration_seconds(approval_spec["expires_in"])),
        created_at=now,
    )


# ---------------------------------------------------------------------- execution


def _finish_fields(
    invocation: Invocation,
    status: str,
    *,
    output: Any = None,
    error: ApiError | None = None,
) -> None:
    invocation.status = status
    invocation.output = output
    invocation.finished_at = timezone.now()
    metrics.observe(
        invocation.tool, status, (invocation.finished_at - invocation.created_at).total_seconds()
    )
    invocation.error = None
    if error is not None:
        # Stored in English; the live answer keeps the error to render either language.
        message = render_message(error.code, error.params, "en")
        invocation.error = {"code": error.code, "message": message}
        invocation.api_error = error


# Failures that say nothing about the upstream's health (they do not trip a breaker).
_NOT_OUTAGES = {"invalid_output"}
_RETRIABLE = {"tool_unavailable", "tool_error"}


def _call_with_retries(
    endpoint: dict[str, Any],
    payload: Any,
    spec: dict[str, Any],
    headers: dict[str, str],
    vetted: Vetted | None = None,
    sandbox: dict[str, Any] | None = None,
    definition: dict[str, Any] | None = None,
) -> Any:
    """Call once; for `idempotent` tools with `spec.retry`, retry unreachable or failing
    upstreams with backoff, all within `timeout_ms`. A timeout is never retried, and a
    non-idempotent tool is never retried at all."""
    retry = spec.get("retry") if spec.get("idempotent") else None
    attempts = int(retry.get("max_attempts", 1)) if retry else 1
    if attempts <= 1:
        return call_endpoint(
            endpoint,
            payload,
            headers=headers,
            vetted=vetted,
            sandbox=sandbox,
            definition=definition,
        )
    timeout_ms = endpoint.get("timeout_ms", 30000)
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = retry.get("backoff_ms", 200) / 1000
    for attempt in range(1, attempts + 1):
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise EndpointError("tool_timeout", "timeout", status="timed_out")
        try:
            return call_endpoint(
                {**endpoint, "timeout_ms": remaining_ms},
                payload,
                headers=headers,
                vetted=vetted,
                sandbox=sandbox,
                definition=definition,
            )
        except EndpointError as exc:
            pause = backoff * (2 ** (attempt - 1))
            if (
                exc.code not in _RETRIABLE
                or attempt == attempts
                or time.monotonic() + pause >= deadline
            ):
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")


def sandbox_profile(tenant: Any, name: str) -> sandboxes.Profile | None:
    """A built-in sandbox profile, or the tenant's `kind: SandboxProfile` of that name."""
    if name in sandboxes.BUILTIN:
        return sandboxes.BUILTIN[name]
    with tenant_scope(tenant, readonly=True):
        version = (
            ManifestVersion.objects.for_tenant(tenant)
            .filter(kind="SandboxProfile", name=name)
            .order_by("-revision")
            .first()
        )
    return sandboxes.profile_from_manifest(version.manifest) if version else None


def _scrubbed_reason(reason: Any, plan: DlpPlan) -> Any:
    """An endpoint failure's reason with DLP applied to what it quotes (a sandboxed
    tool's standard error, say): the entities, and the leased credential."""
    if not isinstance(reason, Text) or not reason.params:
        return reason
    params = {
        key: (
            dlp.scrub(
                value,
                action="mask",
                entities=plan.entities | {"SECRET"},
                secrets=plan.secrets,
            )[0]
            if isinstance(value, str)
            else value
        )
        for key, value in reason.params.items()
    }
    if isinstance(params.get("diagnostic"), str):
        # A sandboxed tool's standard error, cut only now that it is masked.
        params["diagnostic"] = params["diagnostic"][-500:]
    return Text(reason.template, **params)


def _execute(invocation: Invocation, spec: dict[str, Any], raw_input: Any, plan: DlpPlan) -> None:
    """Call the endpoint with `raw_input`, scrub and check the output, and set the
    invocation's final fields (no database writes)."""
    endpoint = spec["endpoint"]
    vetted = None
    if endpoint["type"] in ("http", "mcp"):
        # The addresses vetted here are the ones the call connects to (never resolved
        # again: a rebinding name could answer differently the second time).
        vetted = vet(endpoint["url"])
        if vetted.refusal:
            error = ApiError("endpoint_forbidden", details={"reason": vetted.refusal})
            _finish_fields(invocation, Invocation.DENIED, error=error)
            return
    definition = None
    if endpoint["type"] == "mcp":
        # Checked again here: a queued or approved call may run after a re-sync closed
        # the tool, and must not reach a definition nobody reviewed.
        current, _modules = _read_tool(invocation.tenant, invocation.tool)
        if current is None or current.mcp_drift:
            error = ApiError("tool_unavailable", reason=DEFINITION_CHANGED)
            _finish_fields(invocation, Invocation.UNAVAILABLE, error=error)
            return
        definition = current.mcp_definition
    breaker = spec.get("circuit_breaker")
    ticket = breakers.acquire(str(invocation.tenant_id), invocation.tool, breaker)
    if not ticket.allowed:
        error = ApiError("tool_unavailable", reason=Text(_("its circuit breaker is open")))
        _finish_fields(invocation, Invocation.UNAVAILABLE, error=error)
        return
    lease = None
    headers: dict[str, str] = {}
    if spec.get("credential_ref"):
        try:
            lease = credentials.lease(invocation.tenant, spec["credential_ref"])
        except credentials.CredentialUnavailable:
            logger.warning(
                "credential %s unavailable for %s", spec["credential_ref"], invocation.id
            )
            breakers.release(str(invocation.tenant_id), invocation.tool, breaker, ticket, ok=True)
            error = ApiError("tool_unavailable", reason=Text(_("its credential cannot be leased")))
            _finish_fields(invocation, Invocation.UNAVAILABLE, error=error)
            return
        injection = spec.get("credential_injection") or {}
        headers = {} if endpoint["type"] == "sandbox" else lease.headers(injection)
        invocation.pending_audit.append(
            audit.Entry(
                "credential.lease",
                invocation.api_key_id,
                invocation.id,
                {
                    "invocation_id": invocation.id,
                    "credential": lease.name,
                    "lease_id": lease.lease_id,
                    "backend": lease.backend,
                    "ttl_seconds": lease.ttl_seconds,
                },
            )
        )
        # The leased value is a SECRET wherever it shows up, an upstream's echo included.
        plan = replace(plan, secrets=(*plan.secrets, lease.secret))
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("eai.invocation_id", invocation.id)
    otel.inject(headers)  # the upstream joins the agent's trace
    sandbox = None
    if endpoint["type"] == "sandbox":
        env = {}
        if lease is not None and (spec.get("credential_injection") or {}).get("env"):
            # The bare secret, as the variable the manifest names (SPEC §11).
            env[spec["credential_injection"]["env"]] = lease.secret
        sandbox = {
            "profile": sandbox_profile(invocation.tenant, spec.get("sandbox_profile", "none")),
            "tenant": str(invocation.tenant_id),
            "env": env,
        }
    try:
        if sandbox is not None and sandbox["profile"] is None:
            raise EndpointError(
                "tool_unavailable",
                Text(_("its sandbox profile does not exist")),
                status="unavailable",
            )
        output = _call_with_retries(endpoint, raw_input, spec, headers, vetted, sandbox, definition)
    except EndpointError as exc:
        breakers.release(
            str(invocation.tenant_id), invocation.tool, breaker, ticket, ok=exc.code in _NOT_OUTAGES
        )
        params: dict[str, Any] = {"reason": _scrubbed_reason(exc.reason, plan)}
        if exc.code == "tool_timeout":
            params = {"timeout_ms": endpoint.get("timeout_ms")}
        error = ApiError(exc.code, **params)
        _finish_fields(invocation, exc.status, error=error)
        _charge(invocation, spec)
        return
    finally:
        if lease is not None:
            lease.revoke()
    breakers.release(str(invocation.tenant_id), invocation.tool, breaker, ticket, ok=True)
    clean, found = _scrub(invocation, output, plan, "output")
    if plan.output == "block" and found:
        error = ApiError(
            "dlp_blocked",
            entities=", ".join(sorted(found)),
            where=Text(_("the output")),
            details={"entities": sorted(found), "where": "output"},
        )
        # The gateway withholds the answer: a denial (403), as a block on the input is.
        _finish_fields(invocation, Invocation.DENIED, error=error)
        _charge(invocation, spec)
        return
    if spec.get("output_schema") is not None:
        validator = VALIDATORS.get(digest(spec["output_schema"]), "output", spec["output_schema"])
        try:
            errors = value_free_errors(validator, output)
        except Unresolvable:
            missing = Text(_("the output schema refers to a missing schema"))
            errors = [{"path": "", "message": missing}]
        except UnusablePattern:
            unusable = Text(_("the output schema has a pattern this gateway cannot run"))
            errors = [{"path": "", "message": unusable}]
        except RecursionError:  # `$ref`s that lead back to themselves
            endless = Text(_("the output schema refers to itself without end"))
            errors = [{"path": "", "message": endless}]
        if errors:
            # Said without the offending value (it may be an echoed credential or personal
            # data); the path's keys come from the output, so they are scrubbed too.
            path, _counts = dlp.scrub_text(
                errors[0]["path"] or "/", entities=plan.entities | {"SECRET"}, secrets=plan.secrets
            )
            reason = Text("%(path)s: %(problem)s", path=path[:200], problem=errors[0]["message"])
            error = ApiError("invalid_output", reason=reason)
            _finish_fields(invocation, Invocation.FAILED, error=error)
            _charge(invocation, spec)
            return
    _finish_fields(invocation, Invocation.SUCCEEDED, output=_bounded(invocation, clean))
    _charge(invocation, spec)


def _bounded(invocation: Invocation, output: Any) -> Any:
    """Outputs over EAI_MAX_RESULT_BYTES are stored as a preview plus an artifact."""
    raw = answer_json(output)
    limit = settings.EAI_MAX_RESULT_BYTES
    if len(raw) <= limit:
        return output
    artifact_id = new_id("art")
    invocation._artifact = Artifact(  # saved with the invocation
        id=artifact_id,
        tenant=invocation.tenant,
        invocation=invocation,
        content=raw,
        size=len(raw),
    )
    preview = raw[: limit // 4].decode("utf-8", errors="ignore")
    return {
        "truncated": True,
        "size_bytes": len(raw),
        "artifact_ref": artifact_id,
        "preview": preview,
    }


def _charge(invocation: Invocation, spec: dict[str, Any]) -> None:
    cost = spec["cost"]
    invocation.cost_amount = Decimal(cost["amount"])
    invocation.cost_currency = cost.get("currency", "EUR")


def _store_result(invocation: Invocation) -> None:
    """Record the result of a `running` claim, once (a conditional update), with its
    usage, artifact, audit entry and feed event: one round trip on PostgreSQL. A failed
    audit write fails the call (503)."""
    invocation.sealed_input = None  # the raw input is destroyed once the call ends
    rows: list[tuple[Any, bool]] = []
    artifact = getattr(invocation, "_artifact", None)
    if artifact is not None:
        rows.append((artifact, False))
    usage = finops.usage_for(invocation)
    if usage is not None:
        rows.append((usage, False))
    entries = [*invocation.pending_audit, invoke_entry(invocation)]
    try:
        settled = audit.settle_with_rows(
            invocation.tenant,
            invocation,
            rows,
            entries,
            [agent_event(_outcome_event(invocation), invocation)],
        )
    except DatabaseError as exc:
        logger.exception("audit write failed for %s", invocation.id)
        raise ApiError("audit_unavailable") from exc
    if settled:
        invocation.pending_audit = []
    # else: someone else settled this claim (a recovery sweep); nothing is recorded twice


def execute_queued(invocation_id: str, tenant: Any) -> str | None:
    """Run a `queued` invocation (async invoke, or approved). Safe to deliver twice:
    the claim `queued → running` is a conditional update, so only one runner wins."""
    with tenant_scope(tenant):
        claimed = (
            Invocation.objects.for_tenant(tenant)
            .filter(pk=invocation_id, status=Invocation.QUEUED)
            .update(status=Invocation.RUNNING, started_at=timezone.now())
        )
        if not claimed:
            return None
        invocation = (
            Invocation.objects.for_tenant(tenant)
            .select_related("tenant", "decision")
            .get(pk=invocation_id)
        )
        audit.record(tenant, [], [agent_event("agent.tool.started", invocation)])
    with tenant_scope(tenant, readonly=True):
        version = ManifestVersion.objects.for_tenant(tenant).get(
            kind="Tool", name=invocation.tool, revision=invocation.tool_revision
        )
    spec = version.manifest["spec"]
    invocation.pending_audit = []
    # The budget again, now that the call is about to spend: it was read when the call
    # was admitted, and calls queued or parked since (forty async calls at once, or an
    # approval given after the month's budget ran out) would all have run.
    error = _budget_refusal(invocation.tenant, spec, invocation)
    if error is not None:
        invocation.sealed_input = None
        _finish_fields(invocation, Invocation.DENIED, error=error)
        _store_result(invocation)
        return invocation.status
    raw_input = unseal(invocation.sealed_input) if invocation.sealed_input else invocation.input
    plan = dlp_plan(spec, invocation.decision.obligations, tuple(credentials.known_secrets(tenant)))
    _execute(invocation, spec, raw_input, plan)
    _store_result(invocation)
    return invocation.status


def cancel_invocation(*, key: ApiKey, invocation_id: str) -> Invocation:
    """Cancel a `waiting_approval` or `queued` invocation of the key's tenant (the REST
    cancel route and MCP's `eai_invocation_cancel`); its approval request closes too.
    404 `not_found` for another tenant's or an unknown id, 409 `invalid_state` for any
    other status."""
    tenant = key.tenant
    with tenant_scope(tenant):
        scoped = Invocation.objects.for_tenant(tenant)
        # Rows locked in the order a reviewer's decision locks them (the approval, then
        # its invocation), so a cancel racing a decision waits, never deadlocks; the
        # status is read under the lock, then changed by a conditional update.
        ApprovalRequest.objects.for_tenant(tenant).select_for_update().filter(
            invocation_id=invocation_id
        ).first()
        previous = (
            scoped.select_for_update()
            .filter(id=invocation_id)
            .values_list("status", flat=True)
            .first()
        )
        if previous is None:
            raise ApiError("not_found")
        now = timezone.now()
        changed = scoped.filter(
            id=invocation_id, status__in=[Invocation.WAITING_APPROVAL, Invocation.QUEUED]
        ).update(
            status=Invocation.CANCELLED,
            finished_at=now,
            sealed_input=None,  # the raw input is destroyed once the call ends
            error={"code": "cancelled", "message": "The call was cancelled."},
        )
        if changed:
            ApprovalRequest.objects.for_tenant(tenant).filter(
                invocation_id=invocation_id, status=ApprovalRequest.PENDING
            ).update(status=ApprovalRequest.CANCELLED, decided_at=now)
            # Audited and published in the same transaction, as every mutation is.
            cancelled = scoped.get(id=invocation_id)
            entry = audit.Entry(
                "tool.cancel",
                key.public_id,
                invocation_id,
                {
                    "invocation_id": invocation_id,
                    "previous_status": previous,
                    "approval_id": cancelled.approval_id or None,
                },
            )
            audit.record(
                tenant,
                [entry, invoke_entry(cancelled)],
                [agent_event("agent.error", cancelled)],
            )
            metrics.observe_settled(cancelled)
            return cancelled
    with tenant_scope(tenant, readonly=True):
        current = (
            Invocation.objects.for_tenant(tenant)
            .filter(id=invocation_id)
            .values_list("status", flat=True)
            .first()
        )
    raise ApiError(
        "invalid_state",
        current=current,
        details={"status": current},
        action=Text(_("cancelled")),
        invocation_id=invocation_id,
    )


def recover_stuck(tenant: Any, *, grace_s: float | None = None) -> int:
    """Settle calls left `running` by a process that died mid-call (a killed worker, a
    killed web process): past their timeout plus a grace, a non-idempotent call fails
    with `worker_lost` (its side effect may have happened: it is never repeated) and an
    idempotent one is queued again. Each move is a conditional update."""
    grace = settings.EAI_STUCK_GRACE_S if grace_s is None else grace_s
    now = timezone.now()
    moved = 0
    with tenant_scope(tenant, readonly=True):
        running = list(
            Invocation.objects.for_tenant(tenant)
            .filter(status=Invocation.RUNNING, started_at__lt=now - timedelta(seconds=grace))
            .values_list("id", "tool", "tool_revision", "started_at")[:500]
        )
    for invocation_id, tool, revision, started_at in running:
        with tenant_scope(tenant):
            version = (
                ManifestVersion.objects.for_tenant(tenant)
                .filter(kind="Tool", name=tool, revision=revision)
                .first()
            )
            spec = version.manifest["spec"] if version else {}
            timeout_s = spec.get("endpoint", {}).get("timeout_ms", 30000) / 1000
            if started_at + timedelta(seconds=timeout_s + grace) > now:
                continue
            rows = Invocation.objects.for_tenant(tenant).filter(
                pk=invocation_id, status=Invocation.RUNNING
            )
            invocation = rows.select_related("tenant").first()
            if invocation is None:
                continue
            invocation.pending_audit = []
            if spec.get("idempotent") and invocation.sealed_input is not None:
                if rows.update(status=Invocation.QUEUED):
                    enqueue_execution(invocation_id, tenant)
                    moved += 1
                continue
            error = {
                "code": "worker_lost",
                "message": "The process running this call stopped mid-call; it was not repeated.",
            }
            if rows.update(
                status=Invocation.FAILED, error=error, finished_at=now, sealed_input=None
            ):
                invocation.status, invocation.error, invocation.finished_at = (
                    Invocation.FAILED,
                    error,
                    now,
                )
                audit.record(
                    tenant, [invoke_entry(invocation)], [agent_event("agent.error", invocation)]
                )
                metrics.observe_settled(invocation)
                moved += 1
    moved += _send_queued_again(tenant, now, grace)
    # After the moves above: a call failed `worker_lost` released its hold then (a
    # final status does); what is left is holds of calls that died with no row.
    finops.release_stale_holds(tenant, horizon=_claim_horizon())
    return moved


def _send_queued_again(tenant: Any, now: Any, grace: float) -> int:
    """Send again the calls still `queued` long after they were made. Delivered twice,
    a call still runs once (`execute_queued` claims it).

    The embedded default's runner is a pool of the server's threads, and a killed
    server lost the calls waiting in it; the sweep runs in that same process, so what
    its pool holds is skipped and nothing is queued twice. With a broker, a call can be
    lost between its commit and its send, or by the broker: those still queued after
    10 minutes go again, at most 100 a tenant a sweep (a backlog is not flooded)."""
    brokered = bool(settings.EAI_BROKER_URL)
    horizon = max(grace, 600.0) if brokered else grace
    with tenant_scope(tenant, readonly=True):
        queued = list(
            Invocation.objects.for_tenant(tenant)
            .filter(status=Invocation.QUEUED, created_at__lt=now - timedelta(seconds=horizon))
            .order_by("created_at")
            .values_list("id", flat=True)[: 100 if brokered else 500]
        )
    if not brokered:
        with _LOCAL_LOCK:
            queued = [i for i in queued if i not in _LOCAL_PENDING]
    for invocation_id in queued:
        enqueue_execution(invocation_id, tenant)
    return len(queued)


QUEUE_RETRY_AFTER_S = 5


def _queue_full(tenant: Any) -> bool:
    """Whether the tenant already has `EAI_TENANT_QUEUED_MAX` calls queued (an indexed
    count, on the asynchronous path only). Two racing calls may both pass at the edge:
    the bound is on the flood, not to the unit."""
    limit = settings.EAI_TENANT_QUEUED_MAX
    if limit <= 0:
        return False
    with tenant_scope(tenant, readonly=True):
        queued = Invocation.objects.for_tenant(tenant).filter(status=Invocation.QUEUED)
        return queued[:limit].count() >= limit


def enqueue_execution(invocation_id: str, tenant: Any) -> None:
    """Run a queued invocation once the current transaction commits.

    With a broker, a Celery worker runs it (sent by task name, so this module does not
    import the tasks module); without one, a thread of this process does.
    """
    if settings.EAI_BROKER_URL:
        transaction.on_commit(lambda: _send(invocation_id, tenant))
    else:
        transaction.on_commit(lambda: _run_here(invocation_id, tenant))


def _run_here(invocation_id: str, tenant: Any) -> None:
    with _LOCAL_LOCK:
        if invocation_id in _LOCAL_PENDING:
            return  # already waiting in this process's pool
        _LOCAL_PENDING.add(invocation_id)
    _local_executor().submit(tenant.pk, lambda: _run_local(invocation_id, tenant))


def _send(invocation_id: str, tenant: Any) -> None:
    """To the broker; when it cannot be reached, to a thread of this process. The call
    is committed `queued` by now: failing here answered 500 and left it queued for good
    (nothing sends a queued call again). Delivered twice, it still runs once."""
    try:
        current_app.send_task(
            "gateway.tasks.execute_invocation", args=[invocation_id, str(tenant.id)]
        )
    except Exception:  # kombu's OperationalError and kin: the broker is down
        logger.warning("broker unreachable: %s runs in this process", invocation_id, exc_info=True)
        _run_here(invocation_id, tenant)


def _run_local(invocation_id: str, tenant: Any) -> None:
    try:
        execute_queued(invocation_id, tenant)
    except Exception:
        logger.exception("in-process execution of %s failed", invocation_id)
    finally:
        with _LOCAL_LOCK:
            _LOCAL_PENDING.discard(invocation_id)
        connection.close()  # this thread's own connection; the pool thread lives on


@functools.cache
def _local_executor() -> bulkheads.FairExecutor:
    """Threads for queued calls, at most half of them (EAI_TENANT_SHARE) for one
    tenant: a tenant's slow async calls wait behind its own, never another's."""
    threads = max(1, settings.EAI_TASK_THREADS)
    return bulkheads.FairExecutor(threads, bulkheads.share_of(threads), name="eai-exec")


# The calls this process's pool holds (waiting or running), so none is queued twice.
_LOCAL_PENDING: set[str] = set()
_LOCAL_LOCK = threading.Lock()


# ---------------------------------------------------------------------- answers


def _invocation_outcome(request: Any, invocation: Invocation) -> Outcome:
    """The answer for an invocation: its shape when 2xx, else the envelope."""
    status = STATUS_HTTP.get(invocation.status)
    if status is not None:
        return Outcome(status, answer_json(invocation.as_dict()))
    error: ApiError = getattr(invocation, "api_error", None) or ApiError("internal_error")
    error.refs.update(decision_id=invocation.decision_id, invocation_id=invocation.id)
    return _error(request, error)


post_save.connect(forget_cached_tools, sender=Tool, dispatch_uid="eai-forget-tools-tool")
post_delete.connect(forget_cached_tools, sender=Tool, dispatch_uid="eai-forget-tools-tool-del")
post_save.connect(forget_cached_tools, sender=PolicyModule, dispatch_uid="eai-forget-tools-pm")
post_delete.connect(
    forget_cached_tools, sender=PolicyModule, dispatch_uid="eai-forget-tools-pm-del"
)
