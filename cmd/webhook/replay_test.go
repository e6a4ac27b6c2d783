package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `webhook replay` refuses a command line it cannot carry out with exit
// code 2 and a message naming the flag or file, and replays a log with 0.
func TestReplayCommandLine(t *testing.T) {
	dir := t.TempDir()
	policies := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(policies, []byte(`apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: cms}
spec:
  match: {resources: [{resource: configmaps}]}
  requireResourceVersion: true
`), 0o600); err != nil {
		t.Fatal(err)
	}
	auditLog := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(auditLog, []byte(`{"level":"RequestResponse","auditID":"a","stage":"ResponseComplete","verb":"update","requestURI":"/api/v1/namespaces/t/configmaps/c","user":{"username":"bob","groups":["system:authenticated"]},"objectRef":{"resource":"configmaps","namespace":"t","name":"c","apiVersion":"v1"},"responseStatus":{"code":200},"requestObject":{"metadata":{"name":"c"}},"stageTimestamp":"2026-12-01T10:00:00Z"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"no policies", []string{auditLog}, 2, "--policy-file FILE, or --policies-from-cluster"},
		{"no audit log", []string{"--policy-file", policies}, 2, "name at least one audit log"},
		{"a missing audit log", []string{"--policy-file", policies, filepath.Join(dir, "nope.log")}, 2, "nope.log"},
		{"a bad format", []string{"--policy-file", policies, "--format", "yaml", auditLog}, 2, `--format "yaml"`},
		{"a bad window", []string{"--policy-file", policies, "--since", "soon", auditLog}, 2, "--since"},
		{"a missing policy file", []string{"--policy-file", filepath.Join(dir, "none.yaml"), auditLog}, 2, "none.yaml"},
		{"a kubeconfig without the cluster", []string{"--policy-file", policies, "--kubeconfig", "k", auditLog}, 2, "--kubeconfig is for --policies-from-cluster"},
		{"a replay", []string{"--policy-file", policies, auditLog}, 0, `update configmaps t/c by bob: 422 ConcurrencyPolicy "cms": metadata.resourceVersion`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), append([]string{"replay"}, c.args...), &stdout, &stderr)
			if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.out) {
				t.Errorf("exit %d, want %d with %q\nstdout: %s\nstderr: %s", code, c.code, c.out, stdout.String(), stderr.String())
			}
		})
	}
}
