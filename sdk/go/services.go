package eai

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ToolsService: the catalog and the invoke pipeline.
type ToolsService struct{ c *Client }

// Invoke calls a tool through the gateway's pipeline (POST /v1/tools/{name}/invoke).
// The request holds "arguments" (the tool's input; "input" is accepted too) and may hold
// "run_id", "step_index", "idempotency_key" and "respond_async" (bool):
//
//	out, err := c.Tools.Invoke(ctx, "jira.search", map[string]any{"arguments": map[string]any{"q": "INC-42"}})
//
// A call waiting for approval, queued or running is not an error: the invocation comes
// back with that status (use c.Invocations.Wait). Refusals and failures are *Error.
// Without an idempotency key one is generated, so a 429 or 503 can be retried safely.
func (s *ToolsService) Invoke(ctx context.Context, name string, req map[string]any) (*Invocation, error) {
	body := map[string]any{}
	headers := map[string]string{}
	for k, v := range req {
		switch k {
		case "arguments", "input":
			body["input"] = v
		case "idempotency_key":
			if key, ok := v.(string); ok {
				headers["Idempotency-Key"] = key
			}
		case "respond_async":
			if async, ok := v.(bool); ok && async {
				headers["Prefer"] = "respond-async"
			}
		case "traceparent":
			if tp, ok := v.(string); ok {
				headers["traceparent"] = tp
			}
		default:
			body[k] = v
		}
	}
	if _, ok := body["input"]; !ok {
		body["input"] = map[string]any{}
	}
	if headers["Idempotency-Key"] == "" && s.c.maxRetries > 0 {
		headers["Idempotency-Key"] = NewIdempotencyKey()
	}
	var inv Invocation
	if _, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/tools/" + seg(name) + "/invoke", body: body, headers: headers}, &inv); err != nil {
		return nil, err
	}
	return &inv, nil
}

// List returns one page of the catalog.
func (s *ToolsService) List(ctx context.Context, p ListParams) (*Page[Object], error) {
	var page Page[Object]
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/tools", query: p.values()}, &page)
	return &page, err
}

// Iter walks the whole catalog.
func (s *ToolsService) Iter(p ListParams) *Pager[Object] {
	return newPager(func(ctx context.Context, cursor string) (*Page[Object], error) {
		p.Cursor = cursor
		return s.List(ctx, p)
	})
}

// Get returns one tool of the catalog.
func (s *ToolsService) Get(ctx context.Context, name string) (Object, error) {
	var tool Object
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/tools/" + seg(name)}, &tool)
	return tool, err
}

// ListParams are a list's paging parameters.
type ListParams struct {
	Limit  int
	Cursor string
}

func (p ListParams) values() url.Values {
	v := url.Values{}
	if p.Limit > 0 {
		v.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		v.Set("cursor", p.Cursor)
	}
	return v
}

// InvocationFilter selects invocations (every field optional).
type InvocationFilter struct {
	Status, Tool, RunID, Agent string
	Limit                      int
	Cursor                     string
}

func (f InvocationFilter) values() url.Values {
	v := ListParams{Limit: f.Limit, Cursor: f.Cursor}.values()
	for key, value := range map[string]string{"status": f.Status, "tool": f.Tool, "run_id": f.RunID, "agent": f.Agent} {
		if value != "" {
			v.Set(key, value)
		}
	}
	return v
}

// InvocationsService: reading, waiting on and cancelling invocations.
type InvocationsService struct{ c *Client }

// Get returns one invocation, whatever its status.
func (s *InvocationsService) Get(ctx context.Context, id string) (*Invocation, error) {
	var inv Invocation
	if _, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/tools/invocations/" + seg(id)}, &inv); err != nil {
		return nil, err
	}
	return &inv, nil
}

// Wait long-polls an invocation until its status is final or timeout passes, and returns
// it as it then is (check Pending()).
func (s *InvocationsService) Wait(ctx context.Context, id string, timeout time.Duration) (*Invocation, error) {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		wait := left.Truncate(time.Second)
		if wait > 30*time.Second {
			wait = 30 * time.Second
		}
		q := url.Values{}
		if wait >= time.Second {
			q.Set("wait", strconv.Itoa(int(wait/time.Second)))
		}
		var inv Invocation
		if _, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/tools/invocations/" + seg(id), query: q, extra: wait}, &inv); err != nil {
			return nil, err
		}
		if !inv.Pending() || time.Until(deadline) < time.Second {
			return &inv, nil
		}
		if wait < time.Second { // the server answered at once: do not spin
			select {
			case <-ctx.Done():
				return &inv, ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}

// List returns one page of invocations.
func (s *InvocationsService) List(ctx context.Context, f InvocationFilter) (*Page[Invocation], error) {
	var page Page[Invocation]
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/tools/invocations", query: f.values()}, &page)
	return &page, err
}

// Iter walks every invocation the filter selects, newest first.
func (s *InvocationsService) Iter(f InvocationFilter) *Pager[Invocation] {
	return newPager(func(ctx context.Context, cursor string) (*Page[Invocation], error) {
		f.Cursor = cursor
		return s.List(ctx, f)
	})
}

// Cancel cancels an invocation waiting for approval or queued.
func (s *InvocationsService) Cancel(ctx context.Context, id string) (*Invocation, error) {
	var inv Invocation
	if _, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/tools/invocations/" + seg(id) + "/cancel", body: map[string]any{}}, &inv); err != nil {
		return nil, err
	}
	return &inv, nil
}

// RunsService: agent turns.
type RunsService struct{ c *Client }

// Create starts a run (runID "" lets the gateway choose one).
func (s *RunsService) Create(ctx context.Context, runID, goal string) (Object, error) {
	body := map[string]any{}
	if runID != "" {
		body["run_id"] = runID
	}
	if goal != "" {
		body["goal"] = goal
	}
	var run Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/runs", body: body}, &run)
	return run, err
}

// Get returns a run.
func (s *RunsService) Get(ctx context.Context, runID string) (Object, error) {
	var run Object
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/runs/" + seg(runID)}, &run)
	return run, err
}

// Resume re-reads a run's state after a human decision and publishes the outcome.
func (s *RunsService) Resume(ctx context.Context, runID string) (Object, error) {
	var run Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/runs/" + seg(runID) + "/resume", body: map[string]any{}}, &run)
	return run, err
}

// EventsService: the tenant's event feed.
type EventsService struct{ c *Client }

// EventFilter selects events after a sequence (Cursor), optionally of one run.
type EventFilter struct {
	RunID  string
	Limit  int
	Cursor string
}

// List returns the events after the cursor, in increasing sequence.
func (s *EventsService) List(ctx context.Context, f EventFilter) (*Page[Object], error) {
	q := ListParams{Limit: f.Limit, Cursor: f.Cursor}.values()
	if f.RunID != "" {
		q.Set("run_id", f.RunID)
	}
	var page Page[Object]
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/events", query: q}, &page)
	return &page, err
}

// Iter walks the feed to its current end.
func (s *EventsService) Iter(f EventFilter) *Pager[Object] {
	return newPager(func(ctx context.Context, cursor string) (*Page[Object], error) {
		if cursor != "" {
			f.Cursor = cursor
		}
		return s.List(ctx, f)
	})
}

// ApprovalsService: the reviewers' side (a staff reviewer's key).
type ApprovalsService struct{ c *Client }

// ApprovalFilter selects approval requests.
type ApprovalFilter struct {
	Status, Tool string
	Limit        int
	Cursor       string
}

// List returns one page of approval requests.
func (s *ApprovalsService) List(ctx context.Context, f ApprovalFilter) (*Page[Object], error) {
	q := ListParams{Limit: f.Limit, Cursor: f.Cursor}.values()
	if f.Status != "" {
		q.Set("status", f.Status)
	}
	if f.Tool != "" {
		q.Set("tool", f.Tool)
	}
	var page Page[Object]
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/approvals", query: q}, &page)
	return &page, err
}

// Iter walks every approval request the filter selects.
func (s *ApprovalsService) Iter(f ApprovalFilter) *Pager[Object] {
	return newPager(func(ctx context.Context, cursor string) (*Page[Object], error) {
		f.Cursor = cursor
		return s.List(ctx, f)
	})
}

// Decide approves or denies ("approve" | "deny") with a mandatory reason.
func (s *ApprovalsService) Decide(ctx context.Context, approvalID, verdict, reason string) (Object, error) {
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/approvals/" + seg(approvalID) + "/decision", body: map[string]any{"verdict": verdict, "reason": reason}}, &out)
	return out, err
}

// DecisionsService: recorded policy decisions.
type DecisionsService struct{ c *Client }

// Get returns one decision: result, obligations, policy version, input digest.
func (s *DecisionsService) Get(ctx context.Context, id string) (Object, error) {
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/decisions/" + seg(id)}, &out)
	return out, err
}

// ManifestsService: applying tool and policy manifests.
type ManifestsService struct{ c *Client }

// Apply applies manifests (all or nothing): one manifest object, or
// {"manifests": [...]}. With dryRun nothing changes and the diff is returned.
func (s *ManifestsService) Apply(ctx context.Context, manifests any, dryRun bool) (Object, error) {
	q := url.Values{}
	if dryRun {
		q.Set("dry_run", "true")
	}
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/manifests/apply", query: q, body: manifests}, &out)
	return out, err
}

// ApplyYAML applies manifests written in YAML (one document or a list).
func (s *ManifestsService) ApplyYAML(ctx context.Context, yaml []byte, dryRun bool) (Object, error) {
	if yaml == nil {
		return nil, errors.New("eai: empty YAML")
	}
	q := url.Values{}
	if dryRun {
		q.Set("dry_run", "true")
	}
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/manifests/apply", query: q, rawBody: yaml, contentType: "application/yaml"}, &out)
	return out, err
}

// ContractsService: the JSON Schemas of manifests.
type ContractsService struct{ c *Client }

// Get returns a contract's JSON Schema ("tool-manifest", …).
func (s *ContractsService) Get(ctx context.Context, name string) (Object, error) {
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/contracts/" + seg(name)}, &out)
	return out, err
}

// Validate checks a document against a contract: {"valid": bool, "errors": [...]}.
func (s *ContractsService) Validate(ctx context.Context, name string, document any) (Object, error) {
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/contracts/" + seg(name) + "/validate", body: document}, &out)
	return out, err
}

// UsageService: FinOps usage in and aggregates out.
type UsageService struct{ c *Client }

// Report sends usage events (the body of POST /v1/finops/usage).
func (s *UsageService) Report(ctx context.Context, usage any) (Object, error) {
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodPost, path: "/v1/finops/usage", body: usage}, &out)
	return out, err
}

// UsageQuery groups usage by "tool", "agent" or "run" over a time range (RFC 3339).
type UsageQuery struct {
	GroupBy, From, To string
}

// Get returns usage aggregates.
func (s *UsageService) Get(ctx context.Context, q UsageQuery) (Object, error) {
	v := url.Values{}
	for key, value := range map[string]string{"group_by": q.GroupBy, "from": q.From, "to": q.To} {
		if value != "" {
			v.Set(key, value)
		}
	}
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/finops/usage", query: v}, &out)
	return out, err
}

// AuditService: the tenant's hash-chained audit log.
type AuditService struct{ c *Client }

// Events returns one page of the chain, oldest first.
func (s *AuditService) Events(ctx context.Context, p ListParams) (*Page[Object], error) {
	var page Page[Object]
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/audit/events", query: p.values()}, &page)
	return &page, err
}

// Verify checks the chain: {"valid", "length", "head_hash", "first_invalid_seq", …}.
func (s *AuditService) Verify(ctx context.Context) (Object, error) {
	var out Object
	_, err := s.c.do(ctx, request{method: http.MethodGet, path: "/v1/audit/verify"}, &out)
	return out, err
}
