package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/test/promtest"
	"github.com/stampguard/stampguard/test/testenv"
)

// chartRules is the chart's PrometheusRule, rendered with its defaults
// (ci/defaults-values.yaml: a DSN, which the chart requires), as
// a Prometheus rule file.
func chartRules(t *testing.T) []byte {
	t.Helper()
	rules, err := promtest.RulesOf([]byte(render(t, "defaults", "prometheusRule.enabled=true")))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type promtoolTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			AlertName string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func promtool(t *testing.T) string {
	t.Helper()
	testenv.SkipIfShort(t, "runs promtool")
	p, err := promtest.Binary(promtest.Promtool)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func runTool(t *testing.T, dir, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestPrometheusRulesCheck runs `promtool check rules` (Prometheus 2.42)
// on the chart's rendered PrometheusRule, with every alert that can
// render (webhook and sink enabled).
func TestPrometheusRulesCheck(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), chartRules(t), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runTool(t, dir, promtool(t), "check", "rules", "rules.yaml")
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules said:\n%s", out)
	}
}

// TestPrometheusRulesUnitTests runs `promtool test rules` on
// testdata/promtool against the chart's rendered rules: a storm fires
// within a scrape or two and resolves when it ends, a quiet night and a
// morning ramp stay quiet, a climb fires, and every health alert fires on
// its fault and stays quiet without. Every alert of the chart has a case
// where it fires and one where it must not.
func TestPrometheusRulesUnitTests(t *testing.T) {
	dir := t.TempDir()
	rules := chartRules(t)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join("testdata", "promtool", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in testdata/promtool (%v)", err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tests promtoolTests
		if err := yaml.Unmarshal(b, &tests); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range tests.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.AlertName] = true
				} else {
					quiet[a.AlertName] = true
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Base(f))
	}
	var rf ruleFile
	if err := yaml.Unmarshal(rules, &rf); err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if !fires[r.Alert] {
				t.Errorf("alert %s has no promtool case where it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("alert %s has no promtool case where it stays quiet", r.Alert)
			}
			for _, key := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[key] == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, key)
				}
			}
		}
	}
	for name := range fires {
		if !slices.Contains(alerts, name) {
			t.Errorf("testdata/promtool tests alert %s, which the chart does not render", name)
		}
	}
	out, err := runTool(t, dir, promtool(t), append([]string{"test", "rules"}, names...)...)
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("promtool test rules %s:\n%s", strings.Join(names, " "), out)
}
