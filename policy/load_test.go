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
	for _, want := range []string{path, `line 10 (document 1, ConcurrencyPolicy "deployments"): spec.fieldOwners[0].path`, `line 18 (document 3, ConcurrencyPolicy "configmaps"): spec.action`} {
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

// twoPolicies has its second document start on line 8 and its deepest
// fields on lines 14-18.
const twoPolicies = `apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: configmaps}
spec:
  match: {resources: [{resource: configmaps}]}
  requireResourceVersion: true
---
apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata:
  name: deployments
spec:
  match:
    resources:
    - {group: apps, resource: deployments}
  fieldOwners:
  - path: spec.replicas
    writers:
      serviceAccounts: [kube-system/horizontal-pod-autoscaler]
    action: Deny
`

func TestLoadErrorsNameTheFieldsOwnLine(t *testing.T) {
	if _, err := Load(strings.NewReader(twoPolicies)); err != nil {
		t.Fatalf("the good file is refused: %v", err)
	}
	cases := []struct {
		name, old, new string
		want           []string
	}{
		{"a bad value deep in document 2", "serviceAccounts: [kube-system/horizontal-pod-autoscaler]", "serviceAccounts: [horizontal-pod-autoscaler]",
			[]string{`line 19 (document 2, ConcurrencyPolicy "deployments"): spec.fieldOwners[0].writers.serviceAccounts[0]`, "want namespace/name"}},
		{"a bad action in document 2", "    action: Deny", "    action: Block",
			[]string{`line 20 (document 2, ConcurrencyPolicy "deployments"): spec.fieldOwners[0].action`}},
		{"two bad fields of document 2, each on its own line", "  - path: spec.replicas\n    writers:\n      serviceAccounts: [kube-system/horizontal-pod-autoscaler]\n    action: Deny",
			"  - path: spec..replicas\n    writers:\n      serviceAccounts: [kube-system/horizontal-pod-autoscaler]\n    action: Block",
			[]string{"line 17 (document 2, ", "spec.fieldOwners[0].path", "line 20 (document 2, ", "spec.fieldOwners[0].action"}},
		{"an unknown field in document 2", "  fieldOwners:", "  fieldOwnerz:",
			[]string{"line 16 (document 2)", `unknown field "fieldOwnerz"`}},
		{"a value of the wrong type in document 2", "    - {group: apps, resource: deployments}", "    - {group: apps, resource: [deployments]}",
			[]string{"line 15 (document 2)", "spec.match.resources"}},
		{"a YAML syntax error in document 2", "  match:\n", "  match: : x\n",
			[]string{"line 13 (document 2): yaml: mapping values are not allowed"}},
		{"an unclosed flow mapping in document 2, placed where the parser says", "    writers:\n", "    writers: {\n",
			[]string{"line 17 (document 2): yaml: did not find expected ',' or '}'"}},
		{"a tab in document 2", "    action: Deny", "\taction: Deny",
			[]string{"line 20 (document 2): yaml: "}},
		{"a second document with a foreign kind", "kind: ConcurrencyPolicy\nmetadata:\n  name: deployments", "kind: ConfigMap\nmetadata:\n  name: deployments",
			[]string{"line 9 (document 2): apiVersion"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := strings.Replace(twoPolicies, c.old, c.new, 1)
			if body == twoPolicies {
				t.Fatalf("the case changes nothing")
			}
			_, err := Load(strings.NewReader(body))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, want := range c.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "line 8 ") || strings.Contains(err.Error(), "line 8)") {
				t.Errorf("error %q names the document's start line", err)
			}
		})
	}
}

// FuzzLoad feeds arbitrary streams through loading and the line finding of
// its errors: whatever the file holds, the answer is policies or an error
// that names a line, never a panic.
func FuzzLoad(f *testing.F) {
	f.Add(goodPolicies)
	f.Add(twoPolicies)
	f.Add(strings.Replace(twoPolicies, "    writers:\n", "    writers: {\n", 1))
	f.Add(strings.Replace(twoPolicies, "spec.replicas", "spec..replicas", 1))
	f.Add("---\n---\nkind: [\n")
	f.Fuzz(func(t *testing.T, body string) {
		ps, err := Load(strings.NewReader(body))
		if err != nil {
			if ps != nil {
				t.Fatalf("policies returned with an error: %v", err)
			}
			if !strings.Contains(err.Error(), "line ") {
				t.Fatalf("the error names no line: %v", err)
			}
		}
	})
}
