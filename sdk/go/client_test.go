package eai_test

// The client's own rules (retries, errors, paging), against a local HTTP server that
// answers as the gateway does in the cases that are hard to provoke on a real one.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	eai "github.com/enterprise-ai/sdk-go"
)

type recorder struct {
	mu      sync.Mutex
	keys    []string
	answers []func(w http.ResponseWriter)
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, req.Header.Get("Idempotency-Key"))
	answer := r.answers[0]
	if len(r.answers) > 1 {
		r.answers = r.answers[1:]
	}
	answer(w)
}

func envelope(status int, code, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error": {"code": "` + code + `", "message": "m", "message_i18n": {"en": "m", "fr": "m"}, "details": {}, "request_id": "req_1", "decision_id": null}}`))
	}
}

func invocation(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"invocation_id": "tinv_1", "tool": "t", "status": "succeeded", "extra_field": [1, 2]}`))
}

func newClient(t *testing.T, url string, opts ...eai.Option) *eai.Client {
	c, err := eai.NewClient(append([]eai.Option{eai.WithBaseURL(url), eai.WithAPIKey("eai_a_b")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestItRetriesA429AfterRetryAfterWithTheSameIdempotencyKey(t *testing.T) {
	rec := &recorder{answers: []func(http.ResponseWriter){envelope(429, "rate_limited", "1"), invocation}}
	server := httptest.NewServer(rec)
	defer server.Close()
	start := time.Now()
	inv, err := newClient(t, server.URL).Tools.Invoke(context.Background(), "t", map[string]any{"arguments": map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Status != "succeeded" || time.Since(start) < time.Second {
		t.Fatalf("%s after %v", inv.Status, time.Since(start))
	}
	if len(rec.keys) != 2 || rec.keys[0] == "" || rec.keys[0] != rec.keys[1] {
		t.Fatalf("idempotency keys %q", rec.keys)
	}
}

func TestItNeverRetriesAWriteWithoutAnIdempotencyKey(t *testing.T) {
	rec := &recorder{answers: []func(http.ResponseWriter){envelope(503, "tool_unavailable", "0")}}
	server := httptest.NewServer(rec)
	defer server.Close()
	_, err := newClient(t, server.URL).Approvals.Decide(context.Background(), "apr_1", "approve", "ok")
	var apiErr *eai.Error
	if !errors.As(err, &apiErr) || apiErr.Code != "tool_unavailable" || apiErr.Status != 503 {
		t.Fatalf("%v", err)
	}
	if len(rec.keys) != 1 {
		t.Fatalf("%d requests", len(rec.keys))
	}
}

func TestItRetriesNothingWhenTold(t *testing.T) {
	rec := &recorder{answers: []func(http.ResponseWriter){envelope(429, "rate_limited", "1")}}
	server := httptest.NewServer(rec)
	defer server.Close()
	_, err := newClient(t, server.URL, eai.WithMaxRetries(0)).Tools.Get(context.Background(), "t")
	var apiErr *eai.Error
	if !errors.As(err, &apiErr) || apiErr.RetryAfter != time.Second || len(rec.keys) != 1 {
		t.Fatalf("%v, %d requests", err, len(rec.keys))
	}
}

func TestAnAnswerWithoutTheEnvelopeIsStillATypedError(t *testing.T) {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(502)
		_, _ = w.Write([]byte("<html>bad gateway</html>"))
	}))
	defer server.Close()
	_, err := newClient(t, server.URL).Invocations.Get(context.Background(), "tinv_1")
	var apiErr *eai.Error
	if !errors.As(err, &apiErr) || apiErr.Code != "http_error" || apiErr.Status != 502 || apiErr.Body == "" {
		t.Fatalf("%#v", err)
	}
}

func TestACancelledContextStopsTheRetryWait(t *testing.T) {
	rec := &recorder{answers: []func(http.ResponseWriter){envelope(503, "tool_unavailable", "30")}}
	server := httptest.NewServer(rec)
	defer server.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := newClient(t, server.URL).Tools.Get(ctx, "t")
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
}

func TestAConnectionFailureIsAnErrorWithoutStatus(t *testing.T) {
	server := httptest.NewServer(http.NotFoundHandler())
	url := server.URL
	server.Close()
	_, err := newClient(t, url).Tools.Get(context.Background(), "t")
	var apiErr *eai.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 0 || apiErr.Code != "connection_error" || apiErr.Unwrap() == nil {
		t.Fatalf("%#v", err)
	}
}

func TestItRefusesAClientWithoutURLOrKey(t *testing.T) {
	if _, err := eai.NewClient(eai.WithAPIKey("k")); err == nil {
		t.Fatal("no base URL accepted")
	}
	if _, err := eai.NewClient(eai.WithBaseURL("ftp://x")); err == nil {
		t.Fatal("an ftp URL accepted")
	}
	if _, err := eai.NewClient(eai.WithBaseURL("http://x")); err == nil {
		t.Fatal("no key accepted")
	}
}
