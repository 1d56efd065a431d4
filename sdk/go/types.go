package eai

import (
	"encoding/json"
	"time"
)

// Status values of an invocation.
const (
	StatusWaitingApproval = "waiting_approval"
	StatusQueued          = "queued"
	StatusRunning         = "running"
	StatusSucceeded       = "succeeded"
	StatusFailed          = "failed"
	StatusDenied          = "denied"
	StatusUnavailable     = "unavailable"
	StatusTimedOut        = "timed_out"
	StatusCancelled       = "cancelled"
	StatusExpired         = "expired"
)

// Money is an amount in a currency; the amount is a decimal string ("0.001").
type Money struct {
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
}

// Redaction says what DLP masked: entity type, count and where ("input", "output").
type Redaction struct {
	Entity string `json:"entity"`
	Count  int    `json:"count"`
	Where  string `json:"where"`
}

// InvocationError is a failed or refused invocation's code and message.
type InvocationError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Invocation is one tool call, as the gateway shows it everywhere (masked). It
// JSON-marshals back to exactly the object the gateway sent, fields this version does
// not know included.
type Invocation struct {
	InvocationID string           `json:"invocation_id"`
	Tool         string           `json:"tool"`
	ToolVersion  string           `json:"tool_version"`
	Status       string           `json:"status"`
	Input        map[string]any   `json:"input"`
	Output       any              `json:"output"`
	DecisionID   *string          `json:"decision_id"`
	ApprovalID   *string          `json:"approval_id"`
	Cost         *Money           `json:"cost"`
	RunID        *string          `json:"run_id"`
	StepIndex    *int             `json:"step_index"`
	Agent        string           `json:"agent,omitempty"`
	Redactions   []Redaction      `json:"redactions"`
	CreatedAt    time.Time        `json:"created_at"`
	FinishedAt   *time.Time       `json:"finished_at"`
	Error        *InvocationError `json:"error,omitempty"`
	Diagnostic   *string          `json:"diagnostic,omitempty"`

	raw json.RawMessage
}

type invocationFields Invocation

// UnmarshalJSON keeps the exact object beside the typed fields.
func (i *Invocation) UnmarshalJSON(data []byte) error {
	var f invocationFields
	if err := json.Unmarshal(data, &f); err != nil {
		return err
	}
	*i = Invocation(f)
	i.raw = append(json.RawMessage(nil), data...)
	return nil
}

// MarshalJSON gives the object as the gateway sent it.
func (i Invocation) MarshalJSON() ([]byte, error) {
	if i.raw != nil {
		return i.raw, nil
	}
	return json.Marshal(invocationFields(i))
}

// Pending reports whether the invocation may still change (waiting, queued, running).
func (i *Invocation) Pending() bool {
	switch i.Status {
	case StatusWaitingApproval, StatusQueued, StatusRunning:
		return true
	}
	return false
}

// Object is a JSON object the gateway answers, as decoded by encoding/json.
type Object = map[string]any

// Page is one page of a list: its rows and the cursor of the next page ("" at the end).
type Page[T any] struct {
	Results    []T     `json:"results"`
	NextCursor *string `json:"next_cursor"`
}
