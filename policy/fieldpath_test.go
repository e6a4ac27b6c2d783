package policy

import (
	"strings"
	"testing"
)

func TestParseFieldPath(t *testing.T) {
	good := []string{
		"spec.replicas",
		`metadata.labels["team"]`,
		`metadata.annotations["example.com/owner"]`,
		"spec.template.spec.containers[*].image",
		"spec.template.spec.containers[name=app].image",
		`spec.ports[name="http"].port`,
	}
	for _, s := range good {
		if _, err := ParseFieldPath(s); err != nil {
			t.Errorf("ParseFieldPath(%q): %v", s, err)
		}
	}
	bad := map[string]string{
		"":                          "empty",
		"spec..replicas":            "empty name",
		"spec.":                     "ends with",
		"[*]":                       "must start",
		"spec.[*]":                  "after '.'",
		`metadata.labels["team"`:    "unterminated",
		"metadata.labels[team]":     "none of",
		"metadata.labels.app.k8s/x": "not allowed",
		"spec.containers[=app]":     "none of",
		`metadata.labels[""]`:       "bad quoted key",
	}
	for s, want := range bad {
		_, err := ParseFieldPath(s)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseFieldPath(%q) = %v, want an error containing %q", s, err, want)
		}
	}
}

func TestFieldPathValues(t *testing.T) {
	doc := []byte(`{"metadata":{"labels":{"team":"a","app.kubernetes.io/name":"web"}},
	  "spec":{"replicas":3,"template":{"spec":{"containers":[
	    {"name":"app","image":"app:1"},{"name":"side","image":"side:2"},{"image":"anon:3"}]}}}}`)
	cases := []struct {
		name, path string
		want       []string
	}{
		{"a scalar", "spec.replicas", []string{"3"}},
		{"a map key", `metadata.labels["team"]`, []string{`"a"`}},
		{"a map key with dots and slashes", `metadata.labels["app.kubernetes.io/name"]`, []string{`"web"`}},
		{"every list item", "spec.template.spec.containers[*].image", []string{`"app:1"`, `"side:2"`, `"anon:3"`}},
		{"the list item by key", "spec.template.spec.containers[name=side].image", []string{`"side:2"`}},
		{"a missing member selects nothing", "spec.paused", nil},
		{"a path through a scalar selects nothing", "spec.replicas.value", nil},
		{"a list key that matches nothing selects nothing", "spec.template.spec.containers[name=db].image", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := ParseFieldPath(c.path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Values(doc, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %q, want %q", got, c.want)
			}
			for i := range got {
				if string(got[i]) != c.want[i] {
					t.Fatalf("got %q, want %q", got, c.want)
				}
			}
		})
	}
}
