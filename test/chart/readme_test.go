package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	valuesBegin = "<!-- values:begin (generated from values.schema.json and values.yaml by go test ./test/chart -run TestReadmeValues -update) -->"
	valuesEnd   = "<!-- values:end -->"
)

type schemaNode struct {
	Type        any                    `json:"type"`
	Description string                 `json:"description"`
	Enum        []any                  `json:"enum"`
	Properties  map[string]*schemaNode `json:"properties"`
	Items       *schemaNode            `json:"items"`
}

// TestReadmeValues keeps the values table of the chart's README in sync
// with values.schema.json (descriptions, types) and values.yaml (defaults):
// every value is documented, and only values that exist.
func TestReadmeValues(t *testing.T) {
	dir := chartDir(t)
	var schema schemaNode
	readJSON(t, filepath.Join(dir, "values.schema.json"), &schema)
	var defaults map[string]any
	b, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &defaults); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}

	var rows []string
	var walk func(path string, n *schemaNode, def any)
	walk = func(path string, n *schemaNode, def any) {
		m, isMap := def.(map[string]any)
		if n.Properties != nil && isMap && len(m) > 0 {
			keys := make([]string, 0, len(n.Properties))
			for k := range n.Properties {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if _, ok := m[k]; !ok {
					t.Errorf("%s.%s is in values.schema.json but not in values.yaml", path, k)
				}
				walk(strings.TrimPrefix(path+"."+k, "."), n.Properties[k], m[k])
			}
			for k := range m {
				if _, ok := n.Properties[k]; !ok {
					t.Errorf("%s.%s is in values.yaml but not in values.schema.json", path, k)
				}
			}
			return
		}
		if n.Description == "" {
			t.Errorf("%s has no description in values.schema.json", path)
		}
		d, err := json.Marshal(def)
		if err != nil {
			t.Fatal(err)
		}
		desc := n.Description
		if len(n.Enum) > 0 {
			var es []string
			for _, e := range n.Enum {
				es = append(es, fmt.Sprint(e))
			}
			desc += " One of: " + strings.Join(es, ", ") + "."
		}
		rows = append(rows, fmt.Sprintf("| `%s` | %s | `%s` | %s |", path, typeOf(n), strings.ReplaceAll(string(d), "|", `\|`), strings.ReplaceAll(desc, "|", `\|`)))
	}
	walk("", &schema, defaults)
	table := "| Value | Type | Default | Description |\n| --- | --- | --- | --- |\n" + strings.Join(rows, "\n") + "\n"

	readme := filepath.Join(dir, "README.md")
	b, err = os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start, end := strings.Index(text, valuesBegin), strings.Index(text, valuesEnd)
	if start < 0 || end < start {
		t.Fatalf("%s lacks the markers %q and %q", readme, valuesBegin, valuesEnd)
	}
	current := text[start+len(valuesBegin)+1 : end]
	if *update {
		text = text[:start+len(valuesBegin)] + "\n" + table + text[end:]
		if err := os.WriteFile(readme, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if current != table {
		t.Errorf("the values table in %s is stale (rerun with -update):\n%s", readme, lineDiff(current, table))
	}
}

func typeOf(n *schemaNode) string {
	switch v := n.Type.(type) {
	case string:
		if v == "array" && n.Items != nil && n.Items.Type != nil {
			return fmt.Sprintf("list of %s", typeOf(n.Items))
		}
		return v
	case []any:
		var s []string
		for _, x := range v {
			s = append(s, fmt.Sprint(x))
		}
		return strings.Join(s, " or ")
	}
	return "any"
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
