package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// maxPolicyFileBytes bounds a policy file; real ones are a few kilobytes.
const maxPolicyFileBytes = 8 << 20

// LoadFile reads ConcurrencyPolicies from a multi-document YAML (or JSON)
// file and compiles them. The error names the file, the document and the
// field of every problem found; nothing is returned unless all documents are
// good, so a typo can never silently disable a policy.
func LoadFile(path string) ([]*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load policies: %w", err)
	}
	defer f.Close()
	ps, err := Load(io.LimitReader(f, maxPolicyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("load policies from %s: %w", path, err)
	}
	return ps, nil
}

// Load reads and compiles ConcurrencyPolicies from a multi-document stream.
// Documents are numbered as a reader counts them, empty ones included. Every
// error names the stream's own line of the offending field (of the YAML
// syntax error), not the line where its document starts.
func Load(r io.Reader) ([]*Policy, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if len(data) > maxPolicyFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxPolicyFileBytes)
	}
	var out []*Policy
	var errs []error
	names := map[string]int{}
	for i, d := range splitDocuments(data) {
		doc := i + 1
		if len(bytes.TrimSpace(stripComments(d.body))) == 0 {
			continue
		}
		lines, err := parseLines(d)
		if err != nil {
			line, msg := lines.syntaxError(err)
			errs = append(errs, fmt.Errorf("line %d (document %d): %s", line, doc, msg))
			continue
		}
		at := func(line int, what string) string {
			return fmt.Sprintf("line %d (document %d%s)", line, doc, what)
		}
		var p v1alpha1.ConcurrencyPolicy
		if err := yaml.UnmarshalStrict(d.body, &p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at(lines.ofDecodeError(err), ""), err))
			continue
		}
		if p.APIVersion != v1alpha1.GroupVersion.String() || p.Kind != "ConcurrencyPolicy" {
			errs = append(errs, fmt.Errorf("%s: apiVersion %q kind %q, want %s ConcurrencyPolicy", at(lines.of("kind"), ""), p.APIVersion, p.Kind, v1alpha1.GroupVersion))
			continue
		}
		what := fmt.Sprintf(", ConcurrencyPolicy %q", p.Name)
		if first, dup := names[p.Name]; dup && p.Name != "" {
			errs = append(errs, fmt.Errorf("%s: the name is taken by document %d", at(lines.of("metadata.name"), what), first))
			continue
		}
		names[p.Name] = doc
		if p.Spec.Match.NamespaceSelector != nil {
			errs = append(errs, fmt.Errorf("%s: spec.match.namespaceSelector needs namespace labels from the cluster; use spec.match.namespaces in a policy file", at(lines.of("spec.match.namespaceSelector"), what)))
			continue
		}
		c, err := Compile(&p)
		if err != nil {
			// One error per field, each at the field's own line.
			var agg utilerrors.Aggregate
			if !errors.As(err, &agg) {
				errs = append(errs, fmt.Errorf("%s: %w", at(d.line, what), err))
				continue
			}
			for _, e := range agg.Errors() {
				line := d.line
				var fe *field.Error
				if errors.As(e, &fe) {
					line = lines.of(fe.Field)
				}
				errs = append(errs, fmt.Errorf("%s: %w", at(line, what), e))
			}
			continue
		}
		out = append(out, c)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

type document struct {
	body []byte
	line int // where the document starts, 1-based
}

// splitDocuments cuts a YAML stream at "---" separator lines.
func splitDocuments(data []byte) []document {
	var docs []document
	cur := document{line: 1}
	lineNo := 0
	for line := range bytes.SplitAfterSeq(data, []byte("\n")) {
		lineNo++
		t := bytes.TrimRight(line, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			if lineNo > 1 {
				docs = append(docs, cur)
			}
			cur = document{line: lineNo + 1}
			continue
		}
		cur.body = append(cur.body, line...)
	}
	return append(docs, cur)
}

func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.SplitSeq(doc, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		out = append(out, t...)
	}
	return out
}

// docLines finds the stream's line of a field of one document.
type docLines struct {
	root  *yamlv3.Node // the document's top mapping; nil when unparsable
	start int          // the document's first line in the stream
}

func parseLines(d document) (docLines, error) {
	l := docLines{start: d.line}
	var n yamlv3.Node
	if err := yamlv3.Unmarshal(d.body, &n); err != nil {
		return l, err
	}
	if n.Kind == yamlv3.DocumentNode && len(n.Content) == 1 {
		l.root = n.Content[0]
	}
	return l, nil
}

// abs turns a line of the document (1-based) into a line of the stream.
func (l docLines) abs(line int) int { return l.start + line - 1 }

var yamlLine = regexp.MustCompile(`line (\d+)`)

// syntaxError places a YAML syntax error, whose message counts lines from
// the document's start, on the stream's line, and says every line it
// mentions as a line of the stream.
func (l docLines) syntaxError(err error) (int, string) {
	msg, line := err.Error(), l.start
	if m := yamlLine.FindStringSubmatchIndex(msg); m != nil {
		if n, convErr := strconv.Atoi(msg[m[2]:m[3]]); convErr == nil {
			line = l.abs(n)
			msg = msg[:m[0]] + strings.TrimPrefix(msg[m[1]:], ": ")
		}
	}
	msg = yamlLine.ReplaceAllStringFunc(msg, func(s string) string {
		n, _ := strconv.Atoi(strings.TrimPrefix(s, "line "))
		return "line " + strconv.Itoa(l.abs(n))
	})
	return line, msg
}

var (
	unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)
	typeMismatch = regexp.MustCompile(`cannot unmarshal (\w+) into Go struct field [A-Za-z0-9_]+\.(\S+) of type`)
)

// ofDecodeError finds the field that strict decoding refused. The decoder
// reports JSON, so the field is found by its name (unknown fields) or its
// path (values of the wrong type).
func (l docLines) ofDecodeError(err error) int {
	msg := err.Error()
	if m := typeMismatch.FindStringSubmatch(msg); m != nil {
		return l.ofKind(m[2], m[1])
	}
	if m := unknownField.FindStringSubmatch(msg); m != nil && l.root != nil {
		if k := findKey(l.root, m[1]); k != nil {
			return l.abs(k.Line)
		}
	}
	return l.start
}

// of is the line of a field path such as spec.fieldOwners[0].path; where
// the path leaves the document, the line of its last element found.
func (l docLines) of(path string) int { return l.ofKind(path, "") }

// ofKind is of for a path that may skip list indexes, as the JSON decoder's
// paths do (spec.match.resources.resource): the first list item whose value
// at the path is of the JSON kind ("array", "object", "string", ...) wins.
func (l docLines) ofKind(path, kind string) int {
	if l.root == nil {
		return l.start
	}
	if line, _ := l.find(l.root, pathSteps(path), kind); line > 0 {
		return line
	}
	return l.start
}

// find returns the line of the deepest element of steps found below n, and
// whether all of them were found with a value of the wanted kind.
func (l docLines) find(n *yamlv3.Node, steps []pathStep, kind string) (int, bool) {
	if len(steps) == 0 {
		return l.abs(n.Line), kindIs(n, kind)
	}
	step, rest := steps[0], steps[1:]
	var line int
	var next *yamlv3.Node
	switch {
	case n.Kind == yamlv3.MappingNode && step.index < 0:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == step.name {
				line, next = l.abs(n.Content[i].Line), n.Content[i+1]
				break
			}
		}
	case n.Kind == yamlv3.SequenceNode && step.index >= 0 && step.index < len(n.Content):
		next = n.Content[step.index]
		line = l.abs(next.Line)
	case n.Kind == yamlv3.SequenceNode && step.index < 0:
		first := 0
		for _, item := range n.Content {
			got, ok := l.find(item, steps, kind)
			if ok {
				return got, true
			}
			if first == 0 {
				first = got
			}
		}
		return first, false
	}
	if next == nil {
		return 0, false
	}
	if len(rest) == 0 {
		return line, kindIs(next, kind) // the member's key line, not its value's
	}
	if got, ok := l.find(next, rest, kind); got > 0 {
		return got, ok
	}
	return line, false
}

func kindIs(n *yamlv3.Node, kind string) bool {
	switch kind {
	case "":
		return true
	case "array":
		return n.Kind == yamlv3.SequenceNode
	case "object":
		return n.Kind == yamlv3.MappingNode
	}
	return n.Kind == yamlv3.ScalarNode
}

type pathStep struct {
	name  string
	index int // -1 for a member name
}

// pathSteps splits a field.Path string: members by dots, list indexes in
// brackets.
func pathSteps(path string) []pathStep {
	var out []pathStep
	for part := range strings.SplitSeq(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			out = append(out, pathStep{name: name, index: -1})
		}
		for rest != "" {
			idx, after, _ := strings.Cut(rest, "]")
			if n, err := strconv.Atoi(idx); err == nil {
				out = append(out, pathStep{index: n})
			}
			_, rest, _ = strings.Cut(after, "[")
		}
	}
	return out
}

func findKey(n *yamlv3.Node, name string) *yamlv3.Node {
	if n.Kind == yamlv3.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				return n.Content[i]
			}
		}
	}
	for _, c := range n.Content {
		if k := findKey(c, name); k != nil {
			return k
		}
	}
	return nil
}
