// Package chart tests charts/stampguard: helm lint, golden renders, the
// webhook configurations against webhookconfig.Configurations, server-side dry
// runs and a real install and upgrade against envtest's kube-apiserver, and
// the built binaries started with the rendered containers' args.
package chart

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/testenv"
)

func TestMain(m *testing.M) {
	// controller-runtime complains on stderr unless its global logger is set.
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	if err := bintest.RemoveAll(); err != nil {
		fmt.Fprintln(os.Stderr, "remove the built binaries:", err)
	}
	os.Exit(code)
}

var update = flag.Bool("update", false, "rewrite the golden files and the values table of the chart's README")

// Release is the name and namespace every render uses.
const (
	release   = "sg"
	namespace = "stampguard-system"
)

// valueSets are the files in charts/stampguard/ci that lint, golden, dry-run
// and comparison tests go through.
var valueSets = []string{"defaults", "cert-manager", "existing-secrets", "minimal", "ha-sink"}

func chartDir(t testing.TB) string {
	return filepath.Join(kubetest.RepoRoot(t), "charts", "stampguard")
}

func valuesFile(t testing.TB, set string) string {
	return filepath.Join(chartDir(t), "ci", set+"-values.yaml")
}

// helmBin is bin/helm, which `make helm` installs.
func helmBin(t testing.TB) string {
	t.Helper()
	testenv.SkipIfShort(t, "runs helm")
	p := filepath.Join(kubetest.RepoRoot(t), "bin", "helm")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("helm not found at %s: run `make helm` (make test does), which installs helm v3.22.0 from the Go module proxy", p)
	}
	return p
}

// kubeVersion is the apiserver's version the tests run against. helm
// template and lint assume v1.20.0 unless told, which the chart refuses
// (validate.yaml).
const kubeVersion = "v1.37.2"

// helm runs bin/helm with its state in a temporary directory and returns
// stdout; stderr comes back in the error.
func helm(t testing.TB, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	if (args[0] == "template" || args[0] == "lint") && !slices.Contains(args, "--kube-version") {
		args = append(args, "--kube-version", kubeVersion)
	}
	home := t.TempDir()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+kubeconfig,
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// render is `helm template` of the chart with a value set's file (empty:
// none) and --set flags.
func render(t testing.TB, set string, sets ...string) string {
	t.Helper()
	args := []string{"template", release, chartDir(t), "--namespace", namespace}
	if set != "" {
		args = append(args, "-f", valuesFile(t, set))
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, os.DevNull, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objects decodes a multi-document render.
func objects(t testing.TB, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read rendered YAML: %v", err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("decode rendered YAML: %v\n%s", err, doc)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// find returns the one rendered object of kind and name, decoded into into.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			b, err := yaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.UnmarshalStrict(b, into); err != nil {
				t.Fatalf("decode %s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("the render has no %s %s", kind, name)
}

func kinds(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}
