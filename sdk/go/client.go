// Package eai is the Go client of the EAI Tool Gateway: the governed door through which
// AI agents use tools. Standard library only; Go 1.19 or newer.
//
//	c, _ := eai.NewClient(eai.WithBaseURL(url), eai.WithAPIKey(key))
//	out, err := c.Tools.Invoke(ctx, "jira.search", map[string]any{"arguments": map[string]any{"q": "INC-42"}})
//
// Every call takes a context.Context; every error the gateway answers is an *Error
// (use errors.As). A Client is safe for concurrent use.
package eai

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Version of this SDK.
const Version = "0.1.0"

// Client talks to one gateway with one API key.
type Client struct {
	baseURL    *url.URL
	apiKey     string
	httpClient *http.Client
	language   string
	userAgent  string
	maxRetries int
	maxBackoff time.Duration

	Tools       *ToolsService
	Invocations *InvocationsService
	Runs        *RunsService
	Events      *EventsService
	Approvals   *ApprovalsService
	Decisions   *DecisionsService
	Manifests   *ManifestsService
	Contracts   *ContractsService
	Usage       *UsageService
	Audit       *AuditService
}

// Option configures a Client.
type Option func(*Client) error

// WithBaseURL sets the gateway's URL, e.g. "https://gateway.example.com".
func WithBaseURL(raw string) Option {
	return func(c *Client) error {
		u, err := url.Parse(strings.TrimRight(raw, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("eai: base URL must be an http(s) URL, got %q", raw)
		}
		c.baseURL = u
		return nil
	}
}

// WithAPIKey sets the API key (eai_<id>_<secret>), sent as a Bearer token.
func WithAPIKey(key string) Option {
	return func(c *Client) error { c.apiKey = key; return nil }
}

// WithHTTPClient replaces the HTTP client (transport, proxies, TLS).
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) error {
		if h == nil {
			return errors.New("eai: nil HTTP client")
		}
		c.httpClient = h
		return nil
	}
}

// WithTimeout bounds each HTTP request (default 30 s; a long poll adds its wait).
func WithTimeout(d time.Duration) Option {
	return func(c *Client) error { c.httpClient.Timeout = d; return nil }
}

// WithLanguage asks for error messages in "en" (default) or "fr".
func WithLanguage(lang string) Option {
	return func(c *Client) error { c.language = lang; return nil }
}

// WithMaxRetries sets how many times a 429 or 503 answer is retried (default 2), after
// the server's Retry-After. Only safe requests are retried: reads, and writes carrying
// an idempotency key (Invoke generates one when none is given).
func WithMaxRetries(n int) Option {
	return func(c *Client) error {
		if n < 0 {
			return errors.New("eai: negative retries")
		}
		c.maxRetries = n
		return nil
	}
}

// WithMaxBackoff caps the wait between retries (default 30 s), whatever Retry-After says.
func WithMaxBackoff(d time.Duration) Option {
	return func(c *Client) error { c.maxBackoff = d; return nil }
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(c *Client) error { c.userAgent = ua; return nil }
}

// NewClient makes a client; WithBaseURL and WithAPIKey are required.
func NewClient(opts ...Option) (*Client, error) {
	c := &Client{
		httpClient: &http.Client{Timeout: 30 * time.Second},
		userAgent:  "enterprise-ai-go/" + Version,
		maxRetries: 2,
		maxBackoff: 30 * time.Second,
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	if c.baseURL == nil {
		return nil, errors.New("eai: WithBaseURL is required")
	}
	if c.apiKey == "" {
		return nil, errors.New("eai: WithAPIKey is required")
	}
	c.Tools = &ToolsService{c}
	c.Invocations = &InvocationsService{c}
	c.Runs = &RunsService{c}
	c.Events = &EventsService{c}
	c.Approvals = &ApprovalsService{c}
	c.Decisions = &DecisionsService{c}
	c.Manifests = &ManifestsService{c}
	c.Contracts = &ContractsService{c}
	c.Usage = &UsageService{c}
	c.Audit = &AuditService{c}
	return c, nil
}

// MCPEndpoint is the URL an MCP client uses for this gateway (Streamable HTTP).
func (c *Client) MCPEndpoint() string { return c.baseURL.String() + "/v1/mcp" }

// MCPHeaders are the headers an MCP client sends with every request.
func (c *Client) MCPHeaders() map[string]string {
	return map[string]string{"Authorization": "Bearer " + c.apiKey}
}

// NewIdempotencyKey returns a fresh random key for an Idempotency-Key header.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // the system's random source failed: nothing sensible remains
	}
	return "sdk-go-" + hex.EncodeToString(b)
}

type request struct {
	method      string
	path        string
	query       url.Values
	body        any
	rawBody     []byte
	contentType string
	headers     map[string]string
	// extra time granted over the client's timeout (long polls).
	extra time.Duration
}

// do sends a request and decodes a 2xx JSON answer into out (if not nil). It returns the
// HTTP status of the answer.
func (c *Client) do(ctx context.Context, r request, out any) (int, error) {
	u := *c.baseURL
	u.Path = c.baseURL.Path + r.path
	u.RawPath = ""
	if len(r.query) > 0 {
		u.RawQuery = r.query.Encode()
	}
	var payload []byte
	contentType := r.contentType
	switch {
	case r.rawBody != nil:
		payload = r.rawBody
	case r.body != nil:
		var err error
		if payload, err = json.Marshal(r.body); err != nil {
			return 0, &Error{Code: "invalid_request", Message: err.Error(), Err: err}
		}
		contentType = "application/json"
	}
	safe := r.method == http.MethodGet || r.method == http.MethodHead || r.headers["Idempotency-Key"] != ""
	for attempt := 0; ; attempt++ {
		status, err := c.once(ctx, r, u.String(), payload, contentType, out)
		var apiErr *Error
		if err == nil || !safe || attempt >= c.maxRetries || !errors.As(err, &apiErr) || !apiErr.Retryable() {
			return status, err
		}
		wait := apiErr.RetryAfter
		if wait <= 0 {
			wait = time.Duration(1<<attempt) * 250 * time.Millisecond
		}
		if wait > c.maxBackoff {
			wait = c.maxBackoff
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return status, err
		case <-timer.C:
		}
	}
}

func (c *Client) once(ctx context.Context, r request, target string, payload []byte, contentType string, out any) (int, error) {
	if r.extra > 0 && c.httpClient.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.httpClient.Timeout+r.extra)
		defer cancel()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return 0, &Error{Code: "invalid_request", Message: err.Error(), Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if c.language != "" {
		req.Header.Set("Accept-Language", c.language)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range r.headers {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	httpClient := c.httpClient
	if r.extra > 0 && httpClient.Timeout > 0 {
		copied := *httpClient
		copied.Timeout = httpClient.Timeout + r.extra
		httpClient = &copied
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		code := "connection_error"
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = "timeout"
		} else if errors.Is(err, context.Canceled) {
			code = "cancelled"
		}
		return 0, &Error{Code: code, Message: err.Error(), Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, &Error{Status: resp.StatusCode, Code: "connection_error", Message: err.Error(), Err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, errorFromResponse(resp.StatusCode, resp.Header, raw)
	}
	if out != nil && len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, &Error{Status: resp.StatusCode, Code: "invalid_response", Message: "response is not the expected JSON: " + err.Error(), Body: string(raw), Err: err}
		}
	}
	return resp.StatusCode, nil
}

// escape a path segment (tool names hold dots; ids are opaque).
func seg(s string) string { return url.PathEscape(s) }
