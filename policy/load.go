package policy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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
func Load(r io.Reader) ([]*Policy, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []*Policy
	var errs []error
	names := map[string]int{}
	total := 0
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		total += len(raw)
		if total > maxPolicyFileBytes {
			return nil, fmt.Errorf("larger than %d bytes", maxPolicyFileBytes)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		var p v1alpha1.ConcurrencyPolicy
		if err := yaml.UnmarshalStrict(raw, &p); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", doc, err))
			continue
		}
		if p.APIVersion != v1alpha1.GroupVersion.String() || p.Kind != "ConcurrencyPolicy" {
			errs = append(errs, fmt.Errorf("document %d: apiVersion %q kind %q, want %s ConcurrencyPolicy", doc, p.APIVersion, p.Kind, v1alpha1.GroupVersion))
			continue
		}
		if first, dup := names[p.Name]; dup && p.Name != "" {
			errs = append(errs, fmt.Errorf("document %d: ConcurrencyPolicy %q is also document %d", doc, p.Name, first))
			continue
		}
		names[p.Name] = doc
		if p.Spec.Match.NamespaceSelector != nil {
			errs = append(errs, fmt.Errorf("document %d (ConcurrencyPolicy %q): spec.match.namespaceSelector needs namespace labels from the cluster; use spec.match.namespaces in a policy file", doc, p.Name))
			continue
		}
		c, err := Compile(&p)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d (ConcurrencyPolicy %q): %w", doc, p.Name, err))
			continue
		}
		out = append(out, c)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
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
