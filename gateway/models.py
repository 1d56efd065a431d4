"""The gateway's records: tools and their manifest versions, policy modules, runs,
policy decisions, invocations, approval requests and idempotency records.

Every table here carries `tenant`; every model derives from `TenantOwned`, whose
default manager answers only inside a tenant scope and only that tenant's rows. The
path across tenants is `Model.objects.unscoped()`, and says so.
"""

from __future__ import annotations

import os
import re
import time
from functools import cache
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from django.db import models, router
from django.utils import timezone

from tenants.models import Tenant
from tenants.scope import TenantScopeError, current_tenant

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
# Every pair of Crockford digits, so an id is 13 lookups of 10 bits rather than 26 of 5
# (the ids of one call cost 27 µs the old way, 11 µs this way).
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_SHIFTS = range(120, -1, -10)


def new_id(prefix: str) -> str:
    """`<prefix>_` + 10 chars of millisecond time + 16 random chars (Crockford base32).

    Time-ordered, so ordering by id is ordering by creation, which cursor pagination
    relies on; 80 random bits (from the OS's CSPRNG) make ids unguessable.
    """
    # 130 bits: the time's 48 under two zero bits, then the 80 random ones.
    n = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    return prefix + "_" + "".join([_PAIRS[(n >> shift) & 1023] for shift in _SHIFTS])


# A client-chosen run id (invoke, runs, usage events): 1 to 200 of these characters.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}\Z")

_M = TypeVar("_M", bound=models.Model)


@cache
def _init_plan(model: type[models.Model]) -> tuple[tuple[str, str, Any], ...]:
    """Per concrete field: its name, attname, and default (a callable)."""
    return tuple((f.name, f.attname, f._get_default) for f in model._meta.concrete_fields)


def built(model: type[_M], **values: Any) -> _M:
    """`model(**values)` for the invoke path's new rows, at about a third of the cost.

    Model.__init__ sends pre_init and post_init and goes through a descriptor per field:
    14 µs for an Invocation on the bench machine (5 µs this way), paid for three rows a
    call. This sets what it would set
    (each field's value or default, a relation's id and its cached object, a fresh
    ModelState) and falls back to it when a signal has receivers. Keys are field names
    or attnames, as Model.__init__ takes them.
    """
    if models.signals.pre_init.has_listeners(model) or models.signals.post_init.has_listeners(
        model
    ):
        return model(**values)
    obj = model.__new__(model)
    state = obj._state = models.base.ModelState()
    fields = obj.__dict__
    seen = 0
    for name, attname, default in _init_plan(model):
        if attname in values:
            fields[attname] = values[attname]
            seen += 1
        elif name in values:  # a related object: its id, and the object cached
            related = values[name]
            fields[attname] = None if related is None else related.pk
            state.fields_cache[name] = related
            if related is not None and state.db is None:  # as the relation's descriptor does
                state.db = router.db_for_write(model, instance=related)
            seen += 1
        else:
            fields[attname] = default()
    if seen != len(values):
        names = {n for plan in _init_plan(model) for n in plan[:2]}
        unknown = sorted(set(values) - names)
        raise TypeError(f"{model.__name__}() got unexpected keyword arguments: {unknown}")
    return obj


class TenantQuerySet(models.QuerySet):
    """Rows of tenant-owned models. Those from `Model.objects` are already filtered by
    the active scope's tenant (`_scope_pk`); those from `unscoped()` are not."""

    _scope_pk: Any = None

    def _clone(self) -> TenantQuerySet:
        clone = super()._clone()
        clone._scope_pk = self._scope_pk
        return clone

    def for_tenant(self, tenant: Tenant) -> TenantQuerySet:
        """`tenant`'s rows. Inside a scope this is the scope's filter, already applied;
        another tenant than the scope's is a programming error, said loudly."""
        if self._scope_pk is None:
            return self.filter(tenant=tenant)
        if tenant.pk != self._scope_pk:
            raise TenantScopeError(
                f"{self.model.__name__}: rows of tenant {tenant.pk} asked inside the scope "
                f"of tenant {self._scope_pk}"
            )
        return self

    def update(self, **kwargs: Any) -> int:
        # Rows stay with their tenant: an update inside a scope cannot hand them over.
        moved = kwargs.get("tenant", kwargs.get("tenant_id"))
        if self._scope_pk is not None and getattr(moved, "pk", moved) not in (None, self._scope_pk):
            raise TenantScopeError(f"{self.model.__name__}: rows moved to another tenant")
        return super().update(**kwargs)

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Any]:
        # Rows are built by the caller: check none belongs to another tenant than the
        # scope's (create() goes through save(), which checks the same).
        objs = list(objs)
        if self._scope_pk is not None:
            for obj in objs:
                obj.check_scope()
        return super().bulk_create(objs, *args, **kwargs)


class TenantManager(models.Manager.from_queryset(TenantQuerySet)):
    """The default manager of tenant-owned models: the active scope's tenant's rows,
    and an error outside any scope, so a forgotten filter is never a read across
    tenants (on SQLite nothing else stands between them). `unscoped()` is the one way
    round it, for the few jobs over every tenant; each use says why."""

    def get_queryset(self) -> TenantQuerySet:
        tenant = current_tenant()
        if tenant is None:
            raise TenantScopeError(
                f"{self.model.__name__}.objects used outside a tenant scope: enter "
                "tenants.scope.tenant_scope(tenant), or use "
                f"{self.model.__name__}.objects.unscoped() for a job over every tenant"
            )
        queryset = super().get_queryset()
        # A fresh queryset, not shared yet: filter it in place (filter() would clone).
        queryset.query.add_q(models.Q(tenant_id=tenant.pk))
        queryset._scope_pk = tenant.pk
        return queryset

    def unscoped(self) -> TenantQuerySet:
        """Every tenant's rows, whatever scope is active (PostgreSQL's row-level security
        still applies). For jobs over all tenants only; never on a request's path."""
        return super().get_queryset()


# MCP tool names: several popular hosts reject a whole tool list when one name holds a
# character outside [A-Za-z0-9_-] or is longer than 64, though the protocol allows dots.
MCP_NAME_MAX = 64
_MCP_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_-]")
# The gateway's own MCP tools, listed beside the catalog's (SPEC §10).
MCP_GATEWAY_TOOLS = ("eai_invocation_cancel", "eai_invocation_get")


def mcp_tool_name(name: str) -> str:
    """A manifest name as MCP lists it: every character outside `[A-Za-z0-9_-]` becomes
    `_`, cut at 64 (`jira.search` → `jira_search`). Apply refuses a tool whose MCP name
    another tool of the tenant already has, so the mapping is one to one."""
    return _MCP_UNSAFE_RE.sub("_", name)[:MCP_NAME_MAX]


class TenantOwned(models.Model):
    """Base of every model whose rows belong to a tenant (a `tenant` field).

    Its default manager needs a tenant scope (`TenantManager`); so do save() and
    delete() of one row: a row is written only inside its own tenant's scope. The base
    manager (foreign-key access, cascades) stays Django's plain one: it reaches rows
    from one already read, or deletes what a tenant's deletion takes along.
    """

    objects = TenantManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.check_scope()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        self.check_scope()
        return super().delete(*args, **kwargs)

    def check_scope(self) -> None:
        tenant = current_tenant()
        if tenant is None or tenant.pk != self.tenant_id:
            raise TenantScopeError(
                f"{type(self).__name__} of tenant {self.tenant_id} written outside its "
                f"tenant's scope (active: {tenant.pk if tenant else None})"
            )


class Tool(TenantOwned):
    """A tool in a tenant's catalog; `manifest` is its current version's manifest."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    revision = models.PositiveIntegerField(default=1)
    manifest = models.JSONField()
    digest = models.CharField(max_length=64)
    disabled = models.BooleanField(default=False)
    # `mcp` endpoints: the upstream tool's definition as reviewed at apply, its digest
    # (`sha256:` of its RFC 8785 JSON), and, once a re-sync finds it changed, what was
    # found (`{digest, definition, detected_at}`): the tool stays closed until applied again.
    mcp_pin = models.CharField(max_length=80, blank=True, default="")
    mcp_definition = models.JSONField(null=True, blank=True)
    mcp_drift = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="uniq_tool")]
        # Granted per tool with django-guardian: who may decide this tool's approvals.
        permissions = [("review_tool", "Can decide approvals of this tool")]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def spec(self) -> dict[str, Any]:
        return self.manifest["spec"]

    @property
    def mcp_name(self) -> str:
        return mcp_tool_name(self.name)

    def availability(self, circuit: str = "closed") -> dict[str, Any]:
        """Whether a call can run now: disabled, or its circuit breaker's state."""
        status = "available"
        if self.disabled:
            status = "disabled"
        elif self.mcp_drift:
            status = "definition_changed"  # closed until its manifest is applied again
        elif circuit == "open" or (
            self.spec["endpoint"]["type"] == "sandbox" and not _sandboxes_run()
        ):
            status = "unavailable"
        elif circuit == "half_open":
            status = "degraded"
        return {
            "status": status,
            "disabled": self.disabled,
            "circuit": circuit,
            "endpoint_type": self.spec["endpoint"]["type"],
        }

    def as_catalog(self, circuit: str = "closed") -> dict[str, Any]:
        """The catalog's flat shape: metadata, every spec field at top level, availability."""
        meta = self.manifest["metadata"]
        entry: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "revision": self.revision,
            "description": meta.get("description", ""),
            "labels": meta.get("labels", {}),
        }
        entry.update(self.spec)
        entry["endpoint"] = _shown_endpoint(self.spec["endpoint"])
        entry["availability"] = self.availability(circuit)
        entry["updated_at"] = self.updated_at.isoformat()
        return entry


def _sandboxes_run() -> bool:
    """Whether this gateway can run sandboxed tools now (SPEC §11: else they answer 503,
    and the catalog says so)."""
    from gateway import sandbox  # noqa: PLC0415 - the models load first

    return sandbox.runtime_state()[0] == "ok"


def _shown_endpoint(endpoint: dict[str, Any]) -> dict[str, Any]:
    """The endpoint as agents read it in the catalog: static header values, a URL's
    user:password@ and its query values can carry credentials (apply refuses userinfo
    now; older tools may hold it), and an agent needs none of them to call the tool."""
    shown = dict(endpoint)
    if isinstance(shown.get("headers"), dict):
        shown["headers"] = dict.fromkeys(shown["headers"], "[hidden]")
    url = shown.get("url")
    if isinstance(url, str):
        parts = urlsplit(url)
        if "@" in parts.netloc:
            parts = parts._replace(netloc="[hidden]@" + parts.netloc.rpartition("@")[2])
        if parts.query:  # `?api_key=…`: the names stay, the values go
            names = [field.partition("=")[0] for field in parts.query.split("&")]
            parts = parts._replace(query="&".join(f"{name}=[hidden]" for name in names))
        shown["url"] = urlunsplit(parts)
    return shown


class ManifestVersion(TenantOwned):
    """Every applied version of every manifest (tools and policies), kept for history."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=20)
    name = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    revision = models.PositiveIntegerField()
    manifest = models.JSONField()
    digest = models.CharField(max_length=64)
    diff = models.JSONField(default=list)
    # `mcp` endpoints: the upstream definition reviewed with this version, and its digest.
    mcp_pin = models.CharField(max_length=80, blank=True, default="")
    mcp_definition = models.JSONField(null=True, blank=True)
    applied_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["kind", "name", "-revision"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "kind", "name", "revision"], name="uniq_manifest_revision"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}@{self.version} (r{self.revision})"


class PolicyModuleQuerySet(TenantQuerySet):
    def flag_budget_exceeded(self, modules: list[tuple[str, str]], reason: str) -> int:
        """Mark the versions of `modules` (name, source) that a decision ran past its
        budget with: a module applied since then is another version, left unmarked."""
        match = models.Q(pk__in=[])
        for name, source in modules:
            match |= models.Q(name=name, rego=source)
        return self.filter(match).update(
            budget_exceeded_at=timezone.now(), budget_exceeded_reason=reason[:300]
        )


class PolicyModule(TenantOwned):
    """A tenant's extra Rego module (`kind: Policy` manifest), evaluated with the default.

    `budget_exceeded_at` is set when a decision with this version of the module went
    past the policy budget (SPEC §14), for staff to see; a new version clears it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    rego = models.TextField()
    digest = models.CharField(max_length=64)
    updated_at = models.DateTimeField(default=timezone.now)
    budget_exceeded_at = models.DateTimeField(null=True, blank=True)
    budget_exceeded_reason = models.CharField(max_length=300, blank=True)

    objects = TenantManager.from_queryset(PolicyModuleQuerySet)()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="uniq_policy_module")
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


class Run(TenantOwned):
    """An agent turn. Its id is chosen by the client, unique within the tenant."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    run_id = models.CharField(max_length=200)
    agent = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, default="running")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "run_id"], name="uniq_run")]

    def __str__(self) -> str:
        return self.run_id


class Decision(TenantOwned):
    """A stored policy decision (`dec_…`)."""

    id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=40, default="tool.invoke")
    tool = models.CharField(max_length=200)
    tool_version = models.CharField(max_length=64)
    allow = models.BooleanField()
    reasons = models.JSONField(default=list)
    obligations = models.JSONField(default=list)
    policy_version = models.CharField(max_length=80)
    input_digest = models.CharField(max_length=80)
    api_key_id = models.CharField(max_length=40)
    agent = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.id

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision_id": self.id,
            "action": self.action,
            "tool": self.tool,
            "tool_version": self.tool_version,
            "result": "allow" if self.allow else "deny",
            "allow": self.allow,
            "reasons": self.reasons,
            "obligations": self.obligations,
            "policy_version": self.policy_version,
            "input_digest": self.input_digest,
            "api_key_id": self.api_key_id,
            "agent": self.agent,
            "created_at": self.created_at.isoformat(),
        }


class Invocation(TenantOwned):
    """One call of a tool (`tinv_…`). `input` and `output` are stored masked and bounded."""

    WAITING_APPROVAL = "waiting_approval"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"
    UNAVAILABLE = "unavailable"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    STATUSES = [
        WAITING_APPROVAL,
        QUEUED,
        RUNNING,
        SUCCEEDED,
        FAILED,
        DENIED,
        UNAVAILABLE,
        TIMED_OUT,
        CANCELLED,
        EXPIRED,
    ]
    PENDING = (WAITING_APPROVAL, QUEUED, RUNNING)
    # The door a call came through: the REST invoke route or MCP's tools/call.
    REST = "rest"
    MCP = "mcp"

    id = models.CharField(primary_key=True, max_length=40)
    # Covered by the indexes below that lead with tenant: one less index to write.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool = models.CharField(max_length=200)
    tool_version = models.CharField(max_length=64)
    # The exact manifest revision the call was decided on (a parked call runs with it).
    tool_revision = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, choices=[(s, s) for s in STATUSES])
    input = models.JSONField()
    # The raw input a parked or queued call needs to run later, encrypted at rest;
    # erased once the call ends. Only the executor decrypts it.
    sealed_input = models.BinaryField(null=True, blank=True, editable=False)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    decision = models.ForeignKey(
        Decision, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approval_id = models.CharField(max_length=40, blank=True)
    cost_amount = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    cost_currency = models.CharField(max_length=3, blank=True)
    run_id = models.CharField(max_length=200, blank=True)
    step_index = models.IntegerField(null=True, blank=True)
    redactions = models.JSONField(default=list)
    api_key_id = models.CharField(max_length=40)
    agent = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=40, blank=True)
    door = models.CharField(max_length=8, default=REST, choices=[(REST, REST), (MCP, MCP)])
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "tool", "id"]),
            models.Index(fields=["tenant", "run_id", "id"]),
            models.Index(fields=["tenant", "status", "id"]),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_final(self) -> bool:
        return self.status not in self.PENDING

    def as_dict(self) -> dict[str, Any]:
        """The invocation's one public shape (invoke answer, GET, list rows)."""
        data: dict[str, Any] = {
            "invocation_id": self.id,
            "tool": self.tool,
            "tool_version": self.tool_version,
            "status": self.status,
            "input": self.input,
            "output": self.output,
            "decision_id": self.decision_id,
            "approval_id": self.approval_id or None,
            "cost": (
                {"amount": format_amount(self.cost_amount), "currency": self.cost_currency}
                if self.cost_amount is not None
                else None
            ),
            "run_id": self.run_id or None,
            "step_index": self.step_index,
            "redactions": self.redactions,
            "agent": self.agent or None,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            **_result_refs(self.output),
            "diagnostic": (self.error.get("message") or "")[:DIAGNOSTIC_CHARS]
            if self.error
            else None,
        }
        if self.error:
            data["error"] = self.error
        return data


DIAGNOSTIC_CHARS = 500
_REF_FIELDS = ("object_refs", "artifacts", "observations", "provenance_refs")
_MAX_REFS = 100


def _result_refs(output: Any) -> dict[str, list[Any]]:
    """The structured result's references (the agent tool protocol's results carry
    `object_refs`, `artifacts`, `observations` and `provenance_refs` rather than large
    copied content): the lists a tool put at the top of its output (already scrubbed
    and bounded with it), at most 100 each, and the artifact that keeps an output too
    large to store whole."""
    refs: dict[str, list[Any]] = {field: [] for field in _REF_FIELDS}
    if not isinstance(output, dict):
        return refs
    for field in _REF_FIELDS:
        value = output.get(field)
        if isinstance(value, list):
            refs[field] = value[:_MAX_REFS]
    if output.get("truncated") is True and isinstance(output.get("artifact_ref"), str):
        full = {
            "artifact_ref": output["artifact_ref"],
            "kind": "full_output",
            "size_bytes": output.get("size_bytes"),
        }
        refs["artifacts"] = [full, *refs["artifacts"]][:_MAX_REFS]
    return refs


def format_amount(amount: Any) -> str:
    """'0.001' rather than '0.001000': amounts are shown as the manifest wrote them."""
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


class ApprovalRequest(TenantOwned):
    """A parked call's request for human approval (`apr_…`), bound to the exact call.

    The gateway writes it when it parks a call; reviewers' decisions live in `approvals`.
    """

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    STATUSES = [PENDING, APPROVED, DENIED, EXPIRED, CANCELLED]

    id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    invocation = models.OneToOneField(Invocation, on_delete=models.CASCADE, related_name="approval")
    tool = models.CharField(max_length=200)
    risk_class = models.CharField(max_length=20, default="low")
    status = models.CharField(max_length=20, default=PENDING)
    input_digest = models.CharField(max_length=80)
    decision = models.ForeignKey(Decision, on_delete=models.PROTECT, related_name="+")
    policy_version = models.CharField(max_length=80)
    min_approvers = models.PositiveSmallIntegerField(default=1)
    requested_by_key = models.CharField(max_length=40)
    # The staff users behind the requesting key when the call was made (its user and
    # its creator): separation of duties holds even if the key is changed or revoked.
    requested_by_users = models.JSONField(default=list, blank=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.id


class Artifact(TenantOwned):
    """The full body of a tool output too large to store inline (`art_…`)."""

    id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    invocation = models.ForeignKey(Invocation, on_delete=models.CASCADE, related_name="+")
    content_type = models.CharField(max_length=100, default="application/json")
    content = models.BinaryField()
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.id


class IdempotencyRecord(TenantOwned):
    """An `Idempotency-Key` claim, scoped to tenant and API key.

    The row is inserted before the call runs (the unique constraint makes the claim
    atomic across processes) and completed with the stored response afterwards.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    api_key_id = models.CharField(max_length=40)
    key = models.CharField(max_length=255)
    tool = models.CharField(max_length=200)
    request_digest = models.CharField(max_length=80)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    # The call's invocation, named before its `running` row is written (non-idempotent
    # tools): when the process dies mid-call, a retry under the key answers the outcome
    # the recovery sweep settled, instead of "in progress" for the key's 24 h.
    invocation_id = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "api_key_id", "key"], name="uniq_idempotency_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.api_key_id}:{self.key}"


class TenantLog(TenantOwned):
    """Per-tenant head of the audit chain and of the event feed.

    Appends lock this row (SELECT … FOR UPDATE) for the rest of their transaction, so
    the chain cannot fork and event sequences are handed out in commit order.
    """

    tenant = models.OneToOneField(
        Tenant, primary_key=True, on_delete=models.CASCADE, related_name="+"
    )
    audit_seq = models.BigIntegerField(default=0)
    audit_hash = models.CharField(max_length=64, default="0" * 64)
    event_seq = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant_id}: audit {self.audit_seq}, events {self.event_seq}"


class AuditEventQuerySet(TenantQuerySet):
    """Append-only: bulk updates and deletes are refused."""

    def update(self, **kwargs: Any) -> int:
        raise PermissionError("audit events are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class AuditEvent(TenantOwned):
    """One link of a tenant's hash chain.

    `canonical` holds the exact RFC 8785 bytes that were hashed (as text); the other
    columns are copies for querying, checked against it by verification.
    hash = SHA-256(prev_hash || canonical).
    """

    # Covered by the indexes below that lead with tenant: one less index to write.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    seq = models.BigIntegerField()
    action = models.CharField(max_length=60)
    actor = models.CharField(max_length=200)
    object_ref = models.CharField(max_length=200)
    canonical = models.TextField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantManager.from_queryset(AuditEventQuerySet)()

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "seq"], name="uniq_audit_seq"),
            # A cheap second guard against forks: two links cannot share a parent.
            models.UniqueConstraint(fields=["tenant", "prev_hash"], name="uniq_audit_parent"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.action}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError("audit events are append-only")


class AuditCheckpoint(TenantOwned):
    """A signed copy of a chain head (Ed25519), kept so that a rewrite of the chain's
    tail inside the database is detected against it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    seq = models.BigIntegerField()
    head_hash = models.CharField(max_length=64)
    signature = models.CharField(max_length=128)
    key_id = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "seq"], name="uniq_checkpoint_seq")
        ]

    def __str__(self) -> str:
        return f"checkpoint #{self.seq}"


class Event(TenantOwned):
    """An event of the agent tool protocol feed (`evt_…`), strictly increasing
    `sequence` per tenant. Payloads are bounded and hold no raw personal data."""

    id = models.CharField(primary_key=True, max_length=40)
    # Covered by the indexes below that lead with tenant: one less index to write.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    sequence = models.BigIntegerField()
    type = models.CharField(max_length=60)
    run_id = models.CharField(max_length=200, blank=True)
    invocation_id = models.CharField(max_length=40, blank=True)
    refs = models.JSONField(default=dict)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["sequence"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sequence"], name="uniq_event_sequence")
        ]
        indexes = [models.Index(fields=["tenant", "run_id", "sequence"])]

    def __str__(self) -> str:
        return f"{self.sequence} {self.type}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.id,
            "sequence": self.sequence,
            "type": self.type,
            "created_at": self.created_at.isoformat(),
            "run_id": self.run_id or None,
            "invocation_id": self.invocation_id or None,
            "refs": self.refs,
            "payload": self.payload,
        }


class StoredCredential(TenantOwned):
    """A secret of the in-process credential store, encrypted at rest (Fernet).

    Written by `set_credential` or the admin (write-only); read only to lease it to one
    call. With EAI_BAO_ADDR set, OpenBao holds the secrets instead.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    ciphertext = models.BinaryField(editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="uniq_credential_name")
        ]

    def __str__(self) -> str:
        return self.name


class UsageEvent(TenantOwned):
    """A metered unit of use (`tool_call` for every finished call, or reported through
    `POST /v1/finops/usage`). Undelivered rows are the outbox towards EAI_FINOPS_URL."""

    id = models.CharField(primary_key=True, max_length=40)
    # Covered by the indexes below that lead with tenant: one less index to write.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    source = models.CharField(max_length=20, default="gateway")
    unit = models.CharField(max_length=50, default="tool_call")
    quantity = models.DecimalField(max_digits=18, decimal_places=6, default=1)
    amount = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    currency = models.CharField(max_length=3, default="EUR")
    tool = models.CharField(max_length=200, blank=True)
    agent = models.CharField(max_length=200, blank=True)
    run_id = models.CharField(max_length=200, blank=True)
    invocation_id = models.CharField(max_length=40, blank=True)
    occurred_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-occurred_at"]
        indexes = [
            models.Index(fields=["tenant", "occurred_at"]),
            models.Index(fields=["delivered_at", "occurred_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.unit} {self.amount} {self.currency}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "usage_id": self.id,
            "source": self.source,
            "unit": self.unit,
            "quantity": format_amount(self.quantity),
            "amount": format_amount(self.amount),
            "currency": self.currency,
            "tool": self.tool or None,
            "agent": self.agent or None,
            "run_id": self.run_id or None,
            "invocation_id": self.invocation_id or None,
            "occurred_at": self.occurred_at.isoformat(),
        }


class MonthlySpend(TenantOwned):
    """A tenant's usage amounts summed per month (months of TIME_ZONE) and currency,
    moved in the transaction of every usage event written (a trigger on PostgreSQL,
    `gateway.finops.add_spend` elsewhere). The budget check reads these
    few rows: summing a month of usage events on every call grows with the month, and
    thousands of calls a minute make millions of events."""

    # Covered by the unique constraint below, which leads with tenant.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    month = models.DateField()  # the month's first day
    currency = models.CharField(max_length=3)
    amount = models.DecimalField(max_digits=24, decimal_places=6, default=0)
    # What calls in flight have reserved in this month (BudgetHold rows): the budget
    # covers `amount + reserved`, so concurrent calls never spend past it.
    # db_default: the spend trigger of migration 0010 inserts rows without it.
    reserved = models.DecimalField(max_digits=24, decimal_places=6, default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "month", "currency"], name="uniq_monthly_spend"
            )
        ]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} {self.amount} {self.currency}"


class BudgetHold(TenantOwned):
    """The cost a call in flight reserved against its tenant's monthly budget
    (`gateway.finops.reserve`), added to its month's `MonthlySpend.reserved`. Released
    when the call's invocation reaches a final status, whoever writes it (a trigger on
    both databases, migration 0013); the recovery sweep releases those of calls a dead
    process left (`gateway.finops.release_stale_holds`)."""

    invocation_id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    month = models.DateField()  # the month it was reserved in (its MonthlySpend row)
    currency = models.CharField(max_length=3)
    amount = models.DecimalField(max_digits=24, decimal_places=6)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.invocation_id}: {self.amount} {self.currency}"
