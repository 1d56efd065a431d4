package eai_test

// The shared behaviours of sdk/scenarios.json, run against a live gateway: `make sdk`
// starts one (sdk/testing/gateway.py) and names its config in EAI_SDK_TEST_CONFIG.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	eai "github.com/enterprise-ai/sdk-go"
)

type gatewayConfig struct {
	BaseURL   string            `json:"base_url"`
	Scenarios string            `json:"scenarios"`
	Keys      map[string]string `json:"keys"`
}

type scenario struct {
	ID                      string            `json:"id"`
	Key                     string            `json:"key"`
	OtherKey                string            `json:"other_key"`
	Language                string            `json:"language"`
	Tool                    string            `json:"tool"`
	Input                   map[string]any    `json:"input"`
	ConflictInput           map[string]any    `json:"conflict_input"`
	RunID                   string            `json:"run_id"`
	IdempotencyKey          string            `json:"idempotency_key"`
	Calls                   int               `json:"calls"`
	PageSize                int               `json:"page_size"`
	WaitSeconds             int               `json:"wait_seconds"`
	Approve                 map[string]string `json:"approve"`
	Expect                  map[string]any    `json:"expect"`
	ExpectAfterWait         map[string]any    `json:"expect_after_wait"`
	ExpectError             map[string]any    `json:"expect_error"`
	ExpectErrorOnConflict   map[string]any    `json:"expect_error_on_conflict"`
	ExpectErrorWithoutRetry map[string]any    `json:"expect_error_without_retry"`
	ExpectWithRetry         map[string]any    `json:"expect_with_retry"`
}

func loadConfig(t *testing.T) (gatewayConfig, []scenario) {
	t.Helper()
	path := os.Getenv("EAI_SDK_TEST_CONFIG")
	if path == "" {
		if os.Getenv("EAI_SDK_REQUIRE") == "1" {
			t.Fatal("EAI_SDK_TEST_CONFIG is not set: run `make sdk`")
		}
		t.Skip("no live gateway: run `make sdk` (EAI_SDK_TEST_CONFIG)")
	}
	var cfg gatewayConfig
	mustJSON(t, path, &cfg)
	var file struct {
		Scenarios []scenario `json:"scenarios"`
	}
	mustJSON(t, cfg.Scenarios, &file)
	return cfg, file.Scenarios
}

func mustJSON(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatal(err)
	}
}

func nonce() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func fill(s, n string) string {
	return strings.NewReplacer("{lang}", "go", "{nonce}", n).Replace(s)
}

func client(t *testing.T, cfg gatewayConfig, key string, opts ...eai.Option) *eai.Client {
	t.Helper()
	c, err := eai.NewClient(append([]eai.Option{eai.WithBaseURL(cfg.BaseURL), eai.WithAPIKey(cfg.Keys[key])}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func asError(t *testing.T, err error) *eai.Error {
	t.Helper()
	var apiErr *eai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("want an *eai.Error, got %T: %v", err, err)
	}
	return apiErr
}

func checkError(t *testing.T, err error, want map[string]any) *eai.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error %v, got none", want)
	}
	e := asError(t, err)
	if status, ok := want["status"].(float64); ok && e.Status != int(status) {
		t.Errorf("status %d, want %v (%v)", e.Status, status, e)
	}
	if code, ok := want["code"].(string); ok && e.Code != code {
		t.Errorf("code %q, want %q (%v)", e.Code, code, e)
	}
	if prefix, ok := want["decision_id_prefix"].(string); ok && !strings.HasPrefix(e.DecisionID, prefix) {
		t.Errorf("decision_id %q, want prefix %q", e.DecisionID, prefix)
	}
	if prefix, ok := want["request_id_prefix"].(string); ok && !strings.HasPrefix(e.RequestID, prefix) {
		t.Errorf("request_id %q, want prefix %q", e.RequestID, prefix)
	}
	if text, ok := want["message_contains"].(string); ok && !strings.Contains(e.Message, text) {
		t.Errorf("message %q lacks %q", e.Message, text)
	}
	if text, ok := want["message_i18n_en_contains"].(string); ok && !strings.Contains(e.MessageI18n["en"], text) {
		t.Errorf("message_i18n.en %q lacks %q", e.MessageI18n["en"], text)
	}
	if len(e.MessageI18n) < 2 {
		t.Errorf("message_i18n %v: want en and fr", e.MessageI18n)
	}
	return e
}

func invoke(t *testing.T, c *eai.Client, s scenario, input map[string]any, extra map[string]any) (*eai.Invocation, error) {
	t.Helper()
	req := map[string]any{"arguments": input}
	for k, v := range extra {
		req[k] = v
	}
	return c.Tools.Invoke(context.Background(), s.Tool, req)
}

var runners = map[string]func(t *testing.T, cfg gatewayConfig, s scenario){
	"invoke_masks_iban": func(t *testing.T, cfg gatewayConfig, s scenario) {
		inv, err := invoke(t, client(t, cfg, s.Key), s, s.Input, map[string]any{"run_id": fill(s.RunID, nonce())})
		if err != nil {
			t.Fatal(err)
		}
		if inv.Status != s.Expect["status"] || !strings.HasPrefix(inv.InvocationID, s.Expect["invocation_id_prefix"].(string)) {
			t.Fatalf("got %s %s", inv.Status, inv.InvocationID)
		}
		wire, _ := json.Marshal(inv)
		output, _ := json.Marshal(inv.Output)
		if !strings.Contains(string(output), s.Expect["output_contains"].(string)) || strings.Contains(string(wire), s.Expect["output_not_contains"].(string)) {
			t.Fatalf("output not masked as expected: %s", output)
		}
		var back map[string]any
		if err := json.Unmarshal(wire, &back); err != nil || back["invocation_id"] != inv.InvocationID || back["tool"] != s.Tool {
			t.Fatalf("the invocation does not marshal to the wire object: %s", wire)
		}
	},
	"policy_denied": func(t *testing.T, cfg gatewayConfig, s scenario) {
		_, err := invoke(t, client(t, cfg, s.Key), s, s.Input, nil)
		checkError(t, err, s.ExpectError)
	},
	"tool_not_found": func(t *testing.T, cfg gatewayConfig, s scenario) {
		_, err := invoke(t, client(t, cfg, s.Key), s, s.Input, nil)
		checkError(t, err, s.ExpectError)
	},
	"parked_then_wait": func(t *testing.T, cfg gatewayConfig, s scenario) {
		ctx := context.Background()
		agent := client(t, cfg, s.Key)
		inv, err := invoke(t, agent, s, s.Input, nil)
		if err != nil {
			t.Fatal(err)
		}
		if inv.Status != s.Expect["status"] || inv.ApprovalID == nil || !strings.HasPrefix(*inv.ApprovalID, s.Expect["approval_id_prefix"].(string)) {
			t.Fatalf("not parked: %s %v", inv.Status, inv.ApprovalID)
		}
		reviewer := client(t, cfg, s.Approve["key"])
		if _, err := reviewer.Approvals.Decide(ctx, *inv.ApprovalID, s.Approve["verdict"], s.Approve["reason"]); err != nil {
			t.Fatal(err)
		}
		final, err := agent.Invocations.Wait(ctx, inv.InvocationID, time.Duration(s.WaitSeconds)*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if final.Status != s.ExpectAfterWait["status"] {
			t.Fatalf("after wait: %s", final.Status)
		}
	},
	"idempotent_replay_and_conflict": func(t *testing.T, cfg gatewayConfig, s scenario) {
		c := client(t, cfg, s.Key)
		key := fill(s.IdempotencyKey, nonce())
		first, err := invoke(t, c, s, s.Input, map[string]any{"idempotency_key": key})
		if err != nil {
			t.Fatal(err)
		}
		again, err := invoke(t, c, s, s.Input, map[string]any{"idempotency_key": key})
		if err != nil {
			t.Fatal(err)
		}
		if again.InvocationID != first.InvocationID {
			t.Fatalf("replay made a new invocation: %s != %s", again.InvocationID, first.InvocationID)
		}
		_, err = invoke(t, c, s, s.ConflictInput, map[string]any{"idempotency_key": key})
		checkError(t, err, s.ExpectErrorOnConflict)
	},
	"rate_limited_then_success": func(t *testing.T, cfg gatewayConfig, s scenario) {
		noRetry := client(t, cfg, s.Key, eai.WithMaxRetries(0))
		var limited *eai.Error
		for i := 0; i < 3 && limited == nil; i++ {
			if _, err := invoke(t, noRetry, s, s.Input, nil); err != nil {
				limited = checkError(t, err, s.ExpectErrorWithoutRetry)
			}
		}
		if limited == nil {
			t.Fatal("three calls in a row were never rate limited")
		}
		if min := s.ExpectErrorWithoutRetry["retry_after_min_seconds"].(float64); limited.RetryAfter < time.Duration(min)*time.Second {
			t.Fatalf("Retry-After %v", limited.RetryAfter)
		}
		retrying := client(t, cfg, s.Key, eai.WithMaxRetries(3))
		for i := 0; i < 2; i++ {
			inv, err := invoke(t, retrying, s, s.Input, nil)
			if err != nil {
				t.Fatalf("call %d with retries: %v", i, err)
			}
			if inv.Status != s.ExpectWithRetry["status"] {
				t.Fatalf("call %d: %s", i, inv.Status)
			}
		}
	},
	"pagination": func(t *testing.T, cfg gatewayConfig, s scenario) {
		c := client(t, cfg, s.Key)
		runID := fill(s.RunID, nonce())
		made := map[string]bool{}
		for i := 0; i < s.Calls; i++ {
			inv, err := invoke(t, c, s, s.Input, map[string]any{"run_id": runID, "step_index": i})
			if err != nil {
				t.Fatal(err)
			}
			made[inv.InvocationID] = true
		}
		it := c.Invocations.Iter(eai.InvocationFilter{RunID: runID, Limit: s.PageSize})
		seen := map[string]bool{}
		for it.Next(context.Background()) {
			id := it.Current().InvocationID
			if seen[id] {
				t.Fatalf("%s seen twice", id)
			}
			seen[id] = true
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if len(seen) != int(s.Expect["count"].(float64)) || it.Pages() < int(s.Expect["min_pages"].(float64)) {
			t.Fatalf("%d rows over %d pages", len(seen), it.Pages())
		}
		for id := range made {
			if !seen[id] {
				t.Fatalf("%s not listed", id)
			}
		}
	},
	"french_message": func(t *testing.T, cfg gatewayConfig, s scenario) {
		_, err := invoke(t, client(t, cfg, s.Key, eai.WithLanguage(s.Language)), s, s.Input, nil)
		checkError(t, err, s.ExpectError)
	},
	"cross_tenant_not_found": func(t *testing.T, cfg gatewayConfig, s scenario) {
		inv, err := invoke(t, client(t, cfg, s.Key), s, s.Input, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = client(t, cfg, s.OtherKey).Invocations.Get(context.Background(), inv.InvocationID)
		checkError(t, err, s.ExpectError)
	},
}

func TestScenarios(t *testing.T) {
	cfg, scenarios := loadConfig(t)
	if len(scenarios) == 0 {
		t.Fatal("no scenarios")
	}
	for _, s := range scenarios {
		s := s
		t.Run(s.ID, func(t *testing.T) {
			run, ok := runners[s.ID]
			if !ok {
				t.Fatalf("scenario %q is not implemented by the Go SDK", s.ID)
			}
			run(t, cfg, s)
		})
	}
}
