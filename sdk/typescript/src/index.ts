export { EnterpriseAI, newIdempotencyKey, Tools, Invocations, Runs, Events, Approvals, Decisions, Manifests, Contracts, Usage, Audit } from "./client.js";
export type {
  ClientOptions,
  CallOptions,
  InvokeRequest,
  InvocationFilter,
  Invocation,
  InvocationPage,
  Tool,
  ToolPage,
  Decision,
  Approval,
  ApprovalPage,
  Run,
  Event,
  EventPage,
  UsageAggregatePage,
  UsageAccepted,
  AuditEventPage,
  AuditVerification,
  ManifestApplyResult,
  ContractValidation,
} from "./client.js";
export { EnterpriseAIError } from "./errors.js";
export type { ErrorEnvelope } from "./errors.js";
export type { components, operations, paths } from "./schema.js";
