package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

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
// Documents are numbered as a reader counts them, empty ones included.
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
		where := fmt.Sprintf("document %d (line %d)", doc, d.line)
		if len(bytes.TrimSpace(stripComments(d.body))) == 0 {
			continue
		}
		var p v1alpha1.ConcurrencyPolicy
		if err := yaml.UnmarshalStrict(d.body, &p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if p.APIVersion != v1alpha1.GroupVersion.String() || p.Kind != "ConcurrencyPolicy" {
			errs = append(errs, fmt.Errorf("%s: apiVersion %q kind %q, want %s ConcurrencyPolicy", where, p.APIVersion, p.Kind, v1alpha1.GroupVersion))
			continue
		}
		where = fmt.Sprintf("document %d (ConcurrencyPolicy %q, line %d)", doc, p.Name, d.line)
		if first, dup := names[p.Name]; dup && p.Name != "" {
			errs = append(errs, fmt.Errorf("%s: the name is taken by document %d", where, first))
			continue
		}
		names[p.Name] = doc
		if p.Spec.Match.NamespaceSelector != nil {
			errs = append(errs, fmt.Errorf("%s: spec.match.namespaceSelector needs namespace labels from the cluster; use spec.match.namespaces in a policy file", where))
			continue
		}
		c, err := Compile(&p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
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
