package eai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error is every error the gateway answers (its error envelope), and the errors of
// this client itself (Status 0: the request did not get an answer). Use errors.As:
//
//	var apiErr *eai.Error
//	if errors.As(err, &apiErr) && apiErr.Code == "policy_denied" { … apiErr.DecisionID … }
type Error struct {
	// Status is the HTTP status (0 when no answer was received).
	Status int `json:"status"`
	// Code is the stable snake_case code: policy_denied, tool_not_found, rate_limited, …
	Code string `json:"code"`
	// Message is in the client's language (WithLanguage), English by default.
	Message string `json:"message"`
	// MessageI18n carries the message in every language ("en", "fr").
	MessageI18n map[string]string `json:"message_i18n,omitempty"`
	Details     map[string]any    `json:"details,omitempty"`
	RequestID   string            `json:"request_id,omitempty"`
	DecisionID  string            `json:"decision_id,omitempty"`
	// InvocationID names the invocation the error is about, when one exists.
	InvocationID string `json:"invocation_id,omitempty"`
	// RetryAfter is the server's Retry-After (429, 503), zero when absent.
	RetryAfter time.Duration `json:"-"`
	// Body is the raw answer when it was not the error envelope.
	Body string `json:"-"`
	// Err is the cause of a client-side error (connection refused, timeout, …).
	Err error `json:"-"`
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("eai: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("eai: %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap returns the cause of a client-side error.
func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether the same request may succeed later unchanged.
func (e *Error) Retryable() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable
}

type envelope struct {
	Error *struct {
		Code         string            `json:"code"`
		Message      string            `json:"message"`
		MessageI18n  map[string]string `json:"message_i18n"`
		Details      map[string]any    `json:"details"`
		RequestID    string            `json:"request_id"`
		DecisionID   string            `json:"decision_id"`
		InvocationID string            `json:"invocation_id"`
	} `json:"error"`
	InvocationID string `json:"invocation_id"`
}

func errorFromResponse(status int, header http.Header, body []byte) *Error {
	e := &Error{Status: status, RetryAfter: parseRetryAfter(header.Get("Retry-After"))}
	var env envelope
	if json.Unmarshal(body, &env) == nil && env.Error != nil && env.Error.Code != "" {
		e.Code = env.Error.Code
		e.Message = env.Error.Message
		e.MessageI18n = env.Error.MessageI18n
		e.Details = env.Error.Details
		e.RequestID = env.Error.RequestID
		e.DecisionID = env.Error.DecisionID
		e.InvocationID = env.Error.InvocationID
		if e.InvocationID == "" {
			e.InvocationID = env.InvocationID
		}
		return e
	}
	e.Code = "http_error"
	e.Message = fmt.Sprintf("HTTP %d without the error envelope", status)
	e.Body = string(body)
	return e
}

func parseRetryAfter(value string) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	if seconds, err := strconv.ParseFloat(value, 64); err == nil && seconds >= 0 {
		return time.Duration(seconds * float64(time.Second))
	}
	if when, err := http.ParseTime(value); err == nil {
		if d := time.Until(when); d > 0 {
			return d
		}
	}
	return 0
}
