package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodPolicies = `# two policies
apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: deployments}
spec:
  match:
    resources: [{group: apps, resource: deployments}]
  requireResourceVersion: true
  fieldOwners:
  - path: spec.replicas
    writers: {serviceAccounts: [kube-system/horizontal-pod-autoscaler]}
---
---
apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: configmaps}
spec:
  action: Warn
  match: {resources: [{resource: configmaps}]}
  immutableFields: [{path: 'metadata.labels["team"]', mode: OnceSet}]
`

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ps, err := LoadFile(write("good.yaml", goodPolicies))
	if err != nil {
		t.Fatalf("good file refused: %v", err)
	}
	if got := NewSet(ps...).Names(); strings.Join(got, ",") != "configmaps,deployments" {
		t.Fatalf("loaded %v", got)
	}

	bad := strings.Replace(goodPolicies, "action: Warn", "action: Shout", 1)
	bad = strings.Replace(bad, "path: spec.replicas", "path: spec..replicas", 1)
	path := write("bad.yaml", bad)
	_, err = LoadFile(path)
	if err == nil {
		t.Fatal("bad file accepted")
	}
	for _, want := range []string{path, `document 1 (ConcurrencyPolicy "deployments", line 1)`, "spec.fieldOwners[0].path", `document 3 (ConcurrencyPolicy "configmaps", line 14)`, "spec.action"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}

	_, err = LoadFile(write("typo.yaml", strings.Replace(goodPolicies, "requireResourceVersion", "requireResourceVersoin", 1)))
	if err == nil || !strings.Contains(err.Error(), "requireResourceVersoin") {
		t.Fatalf("an unknown field must be refused by name, got %v", err)
	}
	_, err = LoadFile(write("kind.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"))
	if err == nil || !strings.Contains(err.Error(), "want stampguard.dev/v1alpha1 ConcurrencyPolicy") {
		t.Fatalf("a foreign kind must be refused, got %v", err)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

func TestExamplePoliciesLoad(t *testing.T) {
	ps, err := LoadFile(filepath.Join("..", "examples", "policies.yaml"))
	if err != nil {
		t.Fatalf("examples/policies.yaml: %v", err)
	}
	if len(ps) != 2 {
		t.Fatalf("loaded %d policies, want 2", len(ps))
	}
}
