package policy

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// treePaths overlap on purpose: shared prefixes, [*] beside [k=v] on the
// same list, two selects on one list, and a path that ends inside another.
var treePaths = []string{
	"spec.replicas",
	"spec.template.spec.containers[*].name",
	"spec.template.spec.containers[name=app].image",
	"spec.template.spec.containers[name=app].env[name=A].value",
	"spec.template.spec.containers[name=side].image",
	"spec.template.spec.containers[image=x].name",
	"spec.selector",
	"spec.selector.matchLabels",
	`metadata.labels["team"]`,
	"metadata.resourceVersion",
}

func treeSet(t testing.TB) (*Set, []FieldPath) {
	var paths []FieldPath
	p := &Policy{Name: "p"}
	for i, s := range treePaths {
		fp, err := ParseFieldPath(s)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, fp)
		p.rules = append(p.rules, &immutableRule{index: i, path: fp})
	}
	return NewSet(p), paths
}

// checkTreeAgrees requires the one-pass extraction to find exactly what
// each path finds on its own. The tree reads the whole document, so it may
// refuse malformed JSON that a lone path never reached; it must never
// accept a document a path refuses, nor find other values.
func checkTreeAgrees(t *testing.T, set *Set, paths []FieldPath, doc []byte) {
	refs, treeErr := set.tree.extract(doc, nil)
	if treeErr != nil {
		if !errors.Is(treeErr, rawjson.ErrSyntax) {
			t.Fatalf("doc %q: tree error %v is not a syntax error", doc, treeErr)
		}
		return
	}
	for _, p := range paths {
		want, err := p.Values(doc, nil)
		if err != nil {
			t.Fatalf("doc %q: the tree accepted it, %s refused it: %v", doc, p, err)
		}
		got := valuesOf(refs, set.index[p.text], nil)
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
			t.Fatalf("doc %q, path %s: tree %q, alone %q", doc, p, got, want)
		}
	}
}

func TestTreeExtractionAgreesWithPaths(t *testing.T) {
	set, paths := treeSet(t)
	for _, doc := range []string{
		`{"metadata":{"resourceVersion":"7","labels":{"team":"a"}},"spec":{"replicas":3,"selector":{"matchLabels":{"app":"web"}},
		  "template":{"spec":{"containers":[{"name":"app","image":"x","env":[{"name":"A","value":"1"},{"name":"B"}]},
		  {"image":"y","name":"side"},{"name":"app","image":"z"},"junk",null,{"name":7}]}}}}`,
		`{"spec":{"template":{"spec":{"containers":{"name":"app"}}}}}`,
		`{"spec":null,"metadata":[]}`,
		`{}`,
	} {
		checkTreeAgrees(t, set, paths, []byte(doc))
	}
}

func FuzzTreeExtraction(f *testing.F) {
	set, paths := treeSet(f)
	f.Add([]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"x"},{"name":"side","image":"y"}]}}}}`))
	f.Add([]byte(`{"metadata":{"labels":{"te\u0061m":"a"}},"spec":{"replicas":1}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkTreeAgrees(t, set, paths, doc)
	})
}

func TestTreeRefusesDuplicateMembers(t *testing.T) {
	set, _ := treeSet(t)
	_, err := set.tree.extract([]byte(`{"spec" : {"replicas":1}, "spec"  :  {"replicas":2}}`), nil)
	if !errors.Is(err, rawjson.ErrSyntax) {
		t.Fatalf("want a syntax error naming the duplicate, got %v", err)
	}
}
