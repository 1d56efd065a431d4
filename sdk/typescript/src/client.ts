import { EnterpriseAIError, errorFromResponse } from "./errors.js";
import type { components, operations } from "./schema.js";

type Schemas = components["schemas"];
type Json<Op extends keyof operations, Status extends number> =
  operations[Op]["responses"] extends Record<Status, { content: { "application/json": infer T } }> ? T : never;

export type Invocation = Schemas["Invocation"];
export type InvocationPage = Schemas["InvocationPage"];
export type Tool = Schemas["Tool"];
export type ToolPage = Schemas["ToolPage"];
export type Decision = Schemas["Decision"];
export type Approval = Schemas["Approval"];
export type ApprovalPage = Schemas["ApprovalPage"];
export type Run = Schemas["Run"];
export type Event = Schemas["Event"];
export type EventPage = Schemas["EventPage"];
export type UsageAggregatePage = Schemas["UsageAggregatePage"];
export type UsageAccepted = Schemas["UsageAccepted"];
export type AuditEventPage = Schemas["AuditEventPage"];
export type AuditVerification = Schemas["AuditVerification"];
export type ManifestApplyResult = Schemas["ManifestApplyResult"];
export type ContractValidation = Schemas["ContractValidation"];

export interface ClientOptions {
  /** The gateway's URL, e.g. `https://gateway.example.com`. */
  baseUrl: string;
  /** `eai_<id>_<secret>`, sent as a Bearer token. */
  apiKey: string;
  /** Error messages in `en` (default) or `fr`. */
  language?: "en" | "fr" | string;
  /** Bounds each request, in milliseconds (default 30 000; a long poll adds its wait). */
  timeoutMs?: number;
  /** How many times a 429 or 503 is retried after its Retry-After (default 2). */
  maxRetries?: number;
  /** The longest wait before a retry, in milliseconds (default 30 000). */
  maxBackoffMs?: number;
  /** A fetch of yours (default: the global one, Node ≥ 18 and browsers). */
  fetch?: typeof fetch;
}

/** Per call: an AbortSignal, and extra headers. */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface InvokeRequest {
  /** The tool's input (`input` is accepted too). */
  arguments?: Record<string, unknown>;
  input?: Record<string, unknown>;
  run_id?: string;
  step_index?: number;
  /** Replays the first answer for the same key and body; one is generated when absent. */
  idempotency_key?: string;
  /** Answer 202 at once and run the call in the background. */
  respond_async?: boolean;
  traceparent?: string;
}

export interface InvocationFilter {
  status?: Invocation["status"];
  tool?: string;
  run_id?: string;
  agent?: string;
  limit?: number;
  cursor?: string;
}

interface Request {
  method: "GET" | "POST";
  path: string;
  query?: Record<string, string | number | boolean | undefined | null>;
  body?: unknown;
  rawBody?: string;
  contentType?: string;
  headers?: Record<string, string>;
  extraMs?: number;
  signal?: AbortSignal;
}

const PENDING = new Set(["waiting_approval", "queued", "running"]);

/** A fresh random Idempotency-Key. */
export function newIdempotencyKey(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return "sdk-ts-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function seg(value: string): string {
  if (!value || value === "." || value === "..") throw new TypeError(`invalid path identifier ${JSON.stringify(value)}`);
  return encodeURIComponent(value);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * The TypeScript client of the EAI Tool Gateway.
 *
 * ```ts
 * const out = await new EnterpriseAI({ baseUrl, apiKey }).tools.invoke("jira.search", { arguments: { q: "INC-42" }, run_id: "run_01J9" });
 * ```
 */
export class EnterpriseAI {
  readonly baseUrl: string;
  readonly tools: Tools;
  readonly invocations: Invocations;
  readonly runs: Runs;
  readonly events: Events;
  readonly approvals: Approvals;
  readonly decisions: Decisions;
  readonly manifests: Manifests;
  readonly contracts: Contracts;
  readonly usage: Usage;
  readonly audit: Audit;
  /** @internal */
  readonly options: Required<Omit<ClientOptions, "language" | "fetch">> & { language?: string; fetch: typeof fetch };

  constructor(options: ClientOptions) {
    if (!/^https?:\/\//.test(options.baseUrl ?? "")) throw new TypeError(`baseUrl must be an http(s) URL, got ${options.baseUrl}`);
    if (!options.apiKey) throw new TypeError("apiKey is required");
    const fetchImpl = options.fetch ?? globalThis.fetch;
    if (typeof fetchImpl !== "function") throw new TypeError("no fetch: Node >= 18 or a browser, or pass options.fetch");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.options = {
      baseUrl: this.baseUrl,
      apiKey: options.apiKey,
      language: options.language,
      timeoutMs: options.timeoutMs ?? 30_000,
      maxRetries: options.maxRetries ?? 2,
      maxBackoffMs: options.maxBackoffMs ?? 30_000,
      fetch: fetchImpl.bind(globalThis),
    };
    this.tools = new Tools(this);
    this.invocations = new Invocations(this);
    this.runs = new Runs(this);
    this.events = new Events(this);
    this.approvals = new Approvals(this);
    this.decisions = new Decisions(this);
    this.manifests = new Manifests(this);
    this.contracts = new Contracts(this);
    this.usage = new Usage(this);
    this.audit = new Audit(this);
  }

  /** The URL an MCP client uses for this gateway (Streamable HTTP). */
  get mcpUrl(): string {
    return `${this.baseUrl}/v1/mcp`;
  }

  /** The headers an MCP client sends with every request. */
  mcpHeaders(): Record<string, string> {
    return { Authorization: `Bearer ${this.options.apiKey}` };
  }

  /**
   * @internal One request; retries 429/503 when safe (GET, or an Idempotency-Key), and a
   * safe request whose first try failed to connect, at once: a kept-alive socket the
   * server closed while it sat idle fails the request sent on it.
   */
  async send<T>(request: Request): Promise<T> {
    const safe = request.method === "GET" || Boolean(request.headers?.["Idempotency-Key"]);
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.once<T>(request);
      } catch (error) {
        if (!(error instanceof EnterpriseAIError) || !safe || attempt >= this.options.maxRetries) throw error;
        if (error.code === "connection_error" && attempt === 0) continue;
        if (!error.retryable) throw error;
        const waitMs = error.retry_after != null && error.retry_after > 0 ? error.retry_after * 1000 : 250 * 2 ** attempt;
        await sleep(Math.min(waitMs, this.options.maxBackoffMs), request.signal);
      }
    }
  }

  private async once<T>(request: Request): Promise<T> {
    const url = new URL(this.baseUrl + request.path);
    for (const [key, value] of Object.entries(request.query ?? {})) {
      if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
    }
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.options.apiKey}`,
      Accept: "application/json",
    };
    if (this.options.language) headers["Accept-Language"] = this.options.language;
    let body: string | undefined;
    if (request.rawBody !== undefined) {
      body = request.rawBody;
      headers["Content-Type"] = request.contentType ?? "application/octet-stream";
    } else if (request.body !== undefined) {
      body = JSON.stringify(request.body);
      headers["Content-Type"] = "application/json";
    }
    Object.assign(headers, request.headers ?? {});
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(new Error("timeout")), this.options.timeoutMs + (request.extraMs ?? 0));
    const onAbort = () => timeout.abort(request.signal?.reason);
    request.signal?.addEventListener("abort", onAbort, { once: true });
    let response: Response;
    try {
      response = await this.options.fetch(url, { method: request.method, headers, body, signal: timeout.signal });
    } catch (cause) {
      const aborted = request.signal?.aborted;
      const timedOut = !aborted && timeout.signal.aborted;
      throw new EnterpriseAIError({
        status: 0,
        code: aborted ? "aborted" : timedOut ? "timeout" : "connection_error",
        message: aborted ? "the request was aborted" : timedOut ? `no answer in ${this.options.timeoutMs} ms` : `connection failed: ${String(cause)}`,
        cause,
      });
    } finally {
      clearTimeout(timer);
      request.signal?.removeEventListener("abort", onAbort);
    }
    const text = await response.text();
    let data: unknown = undefined;
    if (text.trim()) {
      try {
        data = JSON.parse(text);
      } catch {
        data = undefined;
      }
    }
    if (!response.ok) throw errorFromResponse(response.status, data ?? null, response.headers.get("Retry-After"));
    if (data === undefined && text.trim()) {
      throw new EnterpriseAIError({ status: response.status, code: "invalid_response", message: "the answer is not JSON" });
    }
    return (data ?? {}) as T;
  }

  /** @internal Walks every row of a list, page after page. */
  async *paginate<Row>(fetchPage: (cursor?: string) => Promise<{ results: Row[]; next_cursor: string | null }>): AsyncGenerator<Row> {
    let cursor: string | undefined;
    const seen = new Set<string>();
    for (;;) {
      const page = await fetchPage(cursor);
      yield* page.results;
      if (!page.next_cursor || seen.has(page.next_cursor) || page.results.length === 0) return;
      seen.add(page.next_cursor);
      cursor = page.next_cursor;
    }
  }
}

class Namespace {
  constructor(protected readonly client: EnterpriseAI) {}
}

/** The catalog and the invoke pipeline. */
export class Tools extends Namespace {
  /**
   * Calls a tool through the pipeline. A call waiting for approval, queued or running is
   * not an error: the invocation comes back with that status (see `invocations.wait`).
   */
  invoke(name: string, request: InvokeRequest = {}, options: CallOptions = {}): Promise<Json<"Invoke_post", 200>> {
    const { arguments: args, input, idempotency_key, respond_async, traceparent, ...rest } = request;
    const headers: Record<string, string> = {};
    const key = idempotency_key ?? (this.client.options.maxRetries > 0 ? newIdempotencyKey() : undefined);
    if (key) headers["Idempotency-Key"] = key;
    if (respond_async) headers.Prefer = "respond-async";
    if (traceparent) headers.traceparent = traceparent;
    const body: Schemas["InvokeRequest"] = { input: args ?? input ?? {}, ...rest };
    return this.client.send({ method: "POST", path: `/v1/tools/${seg(name)}/invoke`, body, headers, signal: options.signal });
  }

  list(params: { limit?: number; cursor?: string } = {}, options: CallOptions = {}): Promise<Json<"ToolList_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/tools", query: params, signal: options.signal });
  }

  iter(params: { limit?: number } = {}, options: CallOptions = {}): AsyncGenerator<Tool> {
    return this.client.paginate((cursor) => this.list({ ...params, cursor }, options));
  }

  get(name: string, options: CallOptions = {}): Promise<Json<"ToolDetail_get", 200>> {
    return this.client.send({ method: "GET", path: `/v1/tools/${seg(name)}`, signal: options.signal });
  }
}

/** Reading, waiting on and cancelling invocations. */
export class Invocations extends Namespace {
  /** One invocation, whatever its status; `wait` (seconds, at most 30) long-polls. */
  get(id: string, params: { wait?: number } = {}, options: CallOptions = {}): Promise<Json<"InvocationDetail_get", 200>> {
    return this.client.send({
      method: "GET",
      path: `/v1/tools/invocations/${seg(id)}`,
      query: { wait: params.wait },
      extraMs: (params.wait ?? 0) * 1000,
      signal: options.signal,
    });
  }

  /** Long-polls until the status is final or `timeoutMs` has passed; the invocation as it then is. */
  async wait(id: string, timeoutMs = 60_000, options: CallOptions = {}): Promise<Invocation> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const left = Math.floor(Math.min(30_000, deadline - Date.now()) / 1000);
      const invocation = await this.get(id, left >= 1 ? { wait: left } : {}, options);
      if (!PENDING.has(invocation.status) || deadline - Date.now() < 1000) return invocation;
      if (left < 1) await sleep(250, options.signal);
    }
  }

  list(filter: InvocationFilter = {}, options: CallOptions = {}): Promise<Json<"InvocationList_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/tools/invocations", query: { ...filter }, signal: options.signal });
  }

  /** Every invocation the filter selects, newest first, as an async iterator. */
  iter(filter: Omit<InvocationFilter, "cursor"> = {}, options: CallOptions = {}): AsyncGenerator<Invocation> {
    return this.client.paginate((cursor) => this.list({ ...filter, cursor }, options));
  }

  cancel(id: string, options: CallOptions = {}): Promise<Json<"InvocationCancel_post", 200>> {
    return this.client.send({ method: "POST", path: `/v1/tools/invocations/${seg(id)}/cancel`, body: {}, signal: options.signal });
  }
}

/** Agent turns. */
export class Runs extends Namespace {
  create(body: Schemas["RunCreateRequest"] = {}, options: CallOptions = {}): Promise<Json<"Runs_post", 201>> {
    return this.client.send({ method: "POST", path: "/v1/runs", body, signal: options.signal });
  }

  get(runId: string, options: CallOptions = {}): Promise<Json<"RunDetail_get", 200>> {
    return this.client.send({ method: "GET", path: `/v1/runs/${seg(runId)}`, signal: options.signal });
  }

  resume(runId: string, options: CallOptions = {}): Promise<Json<"RunResume_post", 200>> {
    return this.client.send({ method: "POST", path: `/v1/runs/${seg(runId)}/resume`, body: {}, signal: options.signal });
  }
}

/** The tenant's event feed. */
export class Events extends Namespace {
  list(params: { cursor?: string; run_id?: string; limit?: number } = {}, options: CallOptions = {}): Promise<Json<"Events_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/events", query: params, signal: options.signal });
  }

  iter(params: { cursor?: string; run_id?: string; limit?: number } = {}, options: CallOptions = {}): AsyncGenerator<Event> {
    const { cursor: start, ...rest } = params;
    return this.client.paginate((cursor) => this.list({ ...rest, cursor: cursor ?? start }, options));
  }
}

/** The reviewers' side (a staff reviewer's key). */
export class Approvals extends Namespace {
  list(params: { status?: string; tool?: string; limit?: number; cursor?: string } = {}, options: CallOptions = {}): Promise<Json<"ApprovalList_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/approvals", query: params, signal: options.signal });
  }

  iter(params: { status?: string; tool?: string; limit?: number } = {}, options: CallOptions = {}): AsyncGenerator<Approval> {
    return this.client.paginate((cursor) => this.list({ ...params, cursor }, options));
  }

  decide(approvalId: string, body: Schemas["ApprovalDecisionRequest"], options: CallOptions = {}): Promise<Json<"ApprovalDecision_post", 200>> {
    return this.client.send({ method: "POST", path: `/v1/approvals/${seg(approvalId)}/decision`, body, signal: options.signal });
  }
}

/** Recorded policy decisions. */
export class Decisions extends Namespace {
  get(id: string, options: CallOptions = {}): Promise<Json<"Decision_get", 200>> {
    return this.client.send({ method: "GET", path: `/v1/decisions/${seg(id)}`, signal: options.signal });
  }
}

/** Tool and policy manifests, applied all or nothing. */
export class Manifests extends Namespace {
  /** One manifest, `{ manifests: [...] }`, or YAML text. */
  apply(manifests: Record<string, unknown> | string, params: { dryRun?: boolean } = {}, options: CallOptions = {}): Promise<Json<"ManifestApply_post", 200>> {
    const query = params.dryRun ? { dry_run: "true" } : undefined;
    if (typeof manifests === "string") {
      return this.client.send({ method: "POST", path: "/v1/manifests/apply", query, rawBody: manifests, contentType: "application/yaml", signal: options.signal });
    }
    return this.client.send({ method: "POST", path: "/v1/manifests/apply", query, body: manifests, signal: options.signal });
  }

  dryRun(manifests: Record<string, unknown> | string, options: CallOptions = {}): Promise<Json<"ManifestApply_post", 200>> {
    return this.apply(manifests, { dryRun: true }, options);
  }
}

/** The JSON Schemas of manifests. */
export class Contracts extends Namespace {
  get(name: string, options: CallOptions = {}): Promise<Json<"Contract_get", 200>> {
    return this.client.send({ method: "GET", path: `/v1/contracts/${seg(name)}`, signal: options.signal });
  }

  validate(name: string, document: unknown, options: CallOptions = {}): Promise<Json<"ContractValidate_post", 200>> {
    return this.client.send({ method: "POST", path: `/v1/contracts/${seg(name)}/validate`, body: document, signal: options.signal });
  }
}

/** FinOps usage. */
export class Usage extends Namespace {
  report(usage: Schemas["UsageReport"], options: CallOptions = {}): Promise<Json<"FinopsUsage_post", 201>> {
    return this.client.send({ method: "POST", path: "/v1/finops/usage", body: usage, signal: options.signal });
  }

  get(params: { group_by?: "tool" | "agent" | "run"; from?: string; to?: string } = {}, options: CallOptions = {}): Promise<Json<"FinopsUsage_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/finops/usage", query: params, signal: options.signal });
  }
}

/** The tenant's hash-chained audit log. */
export class Audit extends Namespace {
  events(params: { limit?: number; cursor?: string } = {}, options: CallOptions = {}): Promise<Json<"AuditEvents_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/audit/events", query: params, signal: options.signal });
  }

  verify(options: CallOptions = {}): Promise<Json<"AuditVerify_get", 200>> {
    return this.client.send({ method: "GET", path: "/v1/audit/verify", signal: options.signal });
  }
}
