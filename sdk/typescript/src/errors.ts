import type { components } from "./schema.js";

/** The error envelope every non-2xx answer carries. */
export type ErrorEnvelope = components["schemas"]["Error"];

/**
 * Every error: the gateway's envelope, or a failure of the client itself (`status` 0,
 * `code` `connection_error`, `timeout` or `aborted`).
 */
export class EnterpriseAIError extends Error {
  /** The HTTP status; 0 when no answer was received. */
  readonly status: number;
  /** The stable snake_case code: `policy_denied`, `tool_not_found`, `rate_limited`, … */
  readonly code: string;
  /** The message in every language (`en`, `fr`). */
  readonly message_i18n: Record<string, string>;
  readonly request_id: string | null;
  readonly decision_id: string | null;
  readonly invocation_id: string | null;
  readonly details: Record<string, unknown>;
  /** The server's Retry-After in seconds (429, 503), null when absent. */
  readonly retry_after: number | null;

  constructor(init: {
    status: number;
    code: string;
    message: string;
    message_i18n?: Record<string, string>;
    request_id?: string | null;
    decision_id?: string | null;
    invocation_id?: string | null;
    details?: Record<string, unknown>;
    retry_after?: number | null;
    cause?: unknown;
  }) {
    super(init.message);
    this.name = "EnterpriseAIError";
    this.status = init.status;
    this.code = init.code;
    this.message_i18n = init.message_i18n ?? {};
    this.request_id = init.request_id ?? null;
    this.decision_id = init.decision_id ?? null;
    this.invocation_id = init.invocation_id ?? null;
    this.details = init.details ?? {};
    this.retry_after = init.retry_after ?? null;
    if (init.cause !== undefined) {
      (this as { cause?: unknown }).cause = init.cause;
    }
  }

  /** Whether the same request may succeed later unchanged (429, 503). */
  get retryable(): boolean {
    return this.status === 429 || this.status === 503;
  }
}

export function parseRetryAfter(value: string | null): number | null {
  if (!value) return null;
  const seconds = Number(value.trim());
  if (Number.isFinite(seconds) && seconds >= 0) return seconds;
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
}

export function errorFromResponse(status: number, body: unknown, retryAfter: string | null): EnterpriseAIError {
  const envelope = body as Partial<ErrorEnvelope> | null;
  const error = envelope && typeof envelope === "object" ? envelope.error : undefined;
  if (error && typeof error === "object" && typeof error.code === "string") {
    return new EnterpriseAIError({
      status,
      code: error.code,
      message: error.message ?? `HTTP ${status}`,
      message_i18n: (error.message_i18n as Record<string, string>) ?? {},
      request_id: error.request_id ?? null,
      decision_id: error.decision_id ?? null,
      invocation_id: error.invocation_id ?? null,
      details: (error.details as Record<string, unknown>) ?? {},
      retry_after: parseRetryAfter(retryAfter),
    });
  }
  return new EnterpriseAIError({
    status,
    code: "http_error",
    message: `HTTP ${status} without the error envelope`,
    retry_after: parseRetryAfter(retryAfter),
  });
}
