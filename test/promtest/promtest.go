// Package promtest gives tests and the demo what they need to run the
// chart's alert rules in a real Prometheus: Debian's prometheus, promtool
// and alertmanager binaries (found on PATH, installed by `make
// prometheus`), and the rule groups of the chart's PrometheusRule as a
// plain Prometheus rule file.
package promtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"sigs.k8s.io/yaml"
)

// Binaries of Debian's prometheus and prometheus-alertmanager packages.
const (
	Prometheus   = "prometheus"
	Promtool     = "promtool"
	Alertmanager = "prometheus-alertmanager"
)

// Binary is the path of one of the binaries, or an error that names the
// make target that installs it.
func Binary(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found on PATH: run `make prometheus` (make test and make demo do), which installs Debian's prometheus and prometheus-alertmanager with apt-get", name)
	}
	return p, nil
}

// ChartRules renders the chart at chartDir with helm (the binary at
// helmBin) and the given --set values, with prometheusRule.enabled=true,
// and returns the rule groups of its PrometheusRule as a Prometheus rule
// file (`groups:` at the top), as the Prometheus operator hands them to
// Prometheus.
func ChartRules(helmBin, chartDir string, sets ...string) ([]byte, error) {
	// helm template assumes Kubernetes 1.20, which the chart refuses; the
	// rules do not depend on the version, so name the one the tests run.
	args := []string{"template", "stampguard", chartDir, "--namespace", "stampguard-system", "--kube-version", "v1.37.2",
		"--set", "prometheusRule.enabled=true", "--set", "auditSink.clickhouse.dsn=clickhouse://clickhouse:9000"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helmBin, args...)
	dir, err := os.MkdirTemp("", "promtest-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+dir, "HELM_CACHE_HOME="+dir, "HELM_DATA_HOME="+dir, "KUBECONFIG="+os.DevNull)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return RulesOf(stdout.Bytes())
}

// RulesOf extracts the spec.groups of every PrometheusRule in a rendered
// manifest into one rule file.
func RulesOf(manifest []byte) ([]byte, error) {
	var groups []any
	for _, doc := range bytes.Split(manifest, []byte("\n---")) {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Groups []any `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("decode rendered manifest: %w", err)
		}
		if obj.Kind == "PrometheusRule" {
			groups = append(groups, obj.Spec.Groups...)
		}
	}
	if len(groups) == 0 {
		return nil, errors.New("the render has no PrometheusRule groups")
	}
	return yaml.Marshal(map[string]any{"groups": groups})
}
