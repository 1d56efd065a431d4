package eai_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeExamples copies every complete program of README.md into a module of its own
// and runs it against the live gateway, as a developer copying it would.
func TestReadmeExamples(t *testing.T) {
	cfg, _ := loadConfig(t)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	sdk, _ := filepath.Abs(".")
	ran := 0
	for _, block := range blocks {
		if !strings.HasPrefix(block[1], "package main") {
			continue
		}
		dir := t.TempDir()
		mod := "module example\n\ngo 1.19\n\nrequire github.com/enterprise-ai/sdk-go v0.0.0\n\nreplace github.com/enterprise-ai/sdk-go => " + sdk + "\n"
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(block[1]), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("go", "run", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "EAI_BASE_URL="+cfg.BaseURL, "EAI_API_KEY="+cfg.Keys["agent"], "GOFLAGS=-mod=mod", "GOPROXY=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("README example failed: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "succeeded") || !strings.Contains(string(out), "policy_denied") {
			t.Fatalf("README example printed:\n%s", out)
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("no complete program in README.md")
	}
}
