package app

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy/admission/admissiontest"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
	"github.com/stampguard/stampguard/test/pkitest"
)

func parseConfigFlags(t *testing.T, args ...string) (webhookconfig.ConfigOptions, error) {
	t.Helper()
	fs := flag.NewFlagSet("configurations", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o webhookconfig.ConfigOptions
	RegisterConfigFlags(fs, &o)
	return o, fs.Parse(args)
}

// The stream is exactly what Configurations builds, decoded as kubectl would.
func TestWriteConfigurationsIsConfigurations(t *testing.T) {
	ca := pkitest.NewCA("test-ca").WriteFile(t, t.TempDir())
	for _, args := range [][]string{
		{"--url", "https://127.0.0.1:9443/", "--ca-bundle", ca},
		{"--service", "stampguard-system/stampguard:8443", "--ca-bundle", ca, "--stamp-failure-policy", "Ignore",
			"--fields-failure-policy", "Fail", "--excluded-namespaces", "kube-system,ops", "--route-all",
			"--resources", "apps/deployments,configmaps", "--break-glass-group", "ops:emergency", "--name", "sg",
			"--timeout-seconds", "10", "--namespace-selector", "team=shop,env notin (dev)"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			o, err := parseConfigFlags(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := webhookconfig.WriteConfigurations(&out, o); err != nil {
				t.Fatal(err)
			}
			wantMut, wantVal := webhookconfig.Configurations(o)
			r := utilyaml.NewYAMLReader(bufio.NewReader(&out))
			var gotMut admissionregistrationv1.MutatingWebhookConfiguration
			var gotVal admissionregistrationv1.ValidatingWebhookConfiguration
			for _, into := range []any{&gotMut, &gotVal} {
				doc, err := r.Read()
				if err != nil {
					t.Fatalf("read document: %v", err)
				}
				if err := yaml.UnmarshalStrict(doc, into); err != nil {
					t.Fatalf("decode %s: %v", doc, err)
				}
			}
			if doc, err := r.Read(); !errors.Is(err, io.EOF) {
				t.Fatalf("a third document %q (%v)", doc, err)
			}
			if !equality.Semantic.DeepEqual(&gotMut, wantMut) || !equality.Semantic.DeepEqual(&gotVal, wantVal) {
				t.Fatalf("the YAML is not what webhookconfig.Configurations builds:\n%s", out.String())
			}
			if gotMut.Kind != "MutatingWebhookConfiguration" || gotVal.Kind != "ValidatingWebhookConfiguration" || gotMut.APIVersion != "admissionregistration.k8s.io/v1" {
				t.Fatalf("types not set: %s", out.String())
			}
			if cc := gotMut.Webhooks[0].ClientConfig; len(cc.CABundle) == 0 || (cc.URL != nil && *cc.URL != "https://127.0.0.1:9443/stamp") {
				t.Fatalf("client config %+v", cc)
			}
		})
	}
}

func TestConfigFlagsFillConfigOptions(t *testing.T) {
	o, err := parseConfigFlags(t, "--service", "ns/svc", "--resources", "apps/deployments, configmaps",
		"--stamp-failure-policy", "Ignore", "--timeout-seconds", "7", "--namespace-selector", "team=shop", "--excluded-namespaces", "")
	if err != nil {
		t.Fatal(err)
	}
	if o.Service == nil || o.Service.Namespace != "ns" || o.Service.Name != "svc" || o.Service.Port != nil {
		t.Errorf("service %+v", o.Service)
	}
	if want := []webhookconfig.GuardedResource{{Group: "apps", Resource: "deployments"}, {Group: "", Resource: "configmaps"}}; !slices.Equal(o.Resources, want) {
		t.Errorf("resources %v, want %v", o.Resources, want)
	}
	if o.StampFailurePolicy != admissionregistrationv1.Ignore || o.FieldsFailurePolicy != "" || o.TimeoutSeconds != 7 ||
		o.NamespaceSelector.MatchLabels["team"] != "shop" || o.ExcludedNamespaces == nil || len(o.ExcludedNamespaces) != 0 {
		t.Errorf("options %+v", o)
	}
	def, err := parseConfigFlags(t, "--url", "https://x")
	if err != nil {
		t.Fatal(err)
	}
	if def.Name != "" || def.StampFailurePolicy != "" || def.TimeoutSeconds != 0 || def.Resources != nil || def.BreakGlassGroup != "" ||
		def.ExcludedNamespaces != nil || def.RouteAll {
		t.Errorf("flags left out set fields: %+v", def)
	}
	if m, v := webhookconfig.Configurations(def); m.Name != "stampguard" || *m.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail ||
		*v.Webhooks[0].FailurePolicy != admissionregistrationv1.Ignore || *m.Webhooks[0].TimeoutSeconds != webhookconfig.DefaultTimeoutSeconds {
		t.Errorf("the defaults of webhookconfig.Configurations did not apply: %+v", m)
	}
	t.Run("the mutating configuration guards scale where it guards the workload", func(t *testing.T) {
		all := def
		all.RouteAll = true
		mut, val := webhookconfig.Configurations(all)
		for _, rules := range [][]admissionregistrationv1.RuleWithOperations{mut.Webhooks[0].Rules, val.Webhooks[0].Rules} {
			var apps []string
			for _, r := range rules {
				if r.APIGroups[0] == "apps" {
					apps = append(apps, r.Resources...)
				}
			}
			for _, want := range []string{"deployments/scale", "statefulsets/scale", "replicasets/scale"} {
				if !slices.Contains(apps, want) {
					t.Errorf("apps rules %v lack %s", apps, want)
				}
			}
			if slices.Contains(apps, "daemonsets/scale") {
				t.Errorf("daemonsets have no scale subresource: %v", apps)
			}
		}
	})
}

func TestBadConfigFlagsAreNamed(t *testing.T) {
	ca := pkitest.NewCA("test-ca").WriteFile(t, t.TempDir())
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"a failure policy other than Fail or Ignore", []string{"--url", "https://x", "--stamp-failure-policy", "fail"}, "want Fail or Ignore"},
		{"a fields failure policy other than Fail or Ignore", []string{"--url", "https://x", "--fields-failure-policy", "never"}, "want Fail or Ignore"},
		{"an excluded namespace that is no namespace name", []string{"--url", "https://x", "--excluded-namespaces", "kube-system,Ops"}, `namespace "Ops"`},
		{"leases in --resources", []string{"--url", "https://x", "--resources", "coordination.k8s.io/leases"}, "never guarded"},
		{"events in --resources", []string{"--url", "https://x", "--resources", "events"}, "never guarded"},
		{"a plain-HTTP URL", []string{"--url", "http://x"}, "want an https:// URL"},
		{"a URL with a query", []string{"--url", "https://x/?a=b"}, "query"},
		{"a service without a namespace", []string{"--service", "stampguard"}, "want namespace/name[:port]"},
		{"a service port out of range", []string{"--service", "ns/svc:70000"}, "want 1 to 65535"},
		{"a service name that is no DNS label", []string{"--service", "ns/Web_Hook"}, `service name "Web_Hook"`},
		{"a missing CA file", []string{"--url", "https://x", "--ca-bundle", "/nonexistent/ca.crt"}, "read CA bundle"},
		{"a CA file without certificates", []string{"--url", "https://x", "--ca-bundle", notPEM}, "holds no PEM certificate"},
		{"a subresource in --resources", []string{"--url", "https://x", "--resources", "apps/deployments/scale"}, "without a subresource"},
		{"a wildcard in --resources", []string{"--url", "https://x", "--resources", "*"}, "name resources"},
		{"an empty item in --resources", []string{"--url", "https://x", "--resources", "configmaps,,secrets"}, "empty item"},
		{"a kind instead of a resource", []string{"--url", "https://x", "--resources", "apps/Deployment"}, "lowercase plural"},
		{"a timeout the apiserver refuses", []string{"--url", "https://x", "--timeout-seconds", "31"}, "1 to 30"},
		{"a bad namespace selector", []string{"--url", "https://x", "--namespace-selector", "a in b"}, "namespace-selector"},
		{"neither a URL nor a Service", []string{"--ca-bundle", ca}, "give a URL (--url) or a Service (--service)"},
		{"both a URL and a Service", []string{"--url", "https://x", "--service", "ns/svc"}, "not both"},
		{"a break-glass group that would break the CEL literal", []string{"--url", "https://x", "--break-glass-group", "x') || true || ('"}, "quotes"},
		{"a name the apiserver refuses", []string{"--url", "https://x", "--name", "Stamp Guard"}, `name "Stamp Guard"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("configurations", flag.ContinueOnError)
			var stderr bytes.Buffer
			fs.SetOutput(&stderr)
			var o webhookconfig.ConfigOptions
			RegisterConfigFlags(fs, &o)
			err := fs.Parse(c.args)
			if err == nil {
				err = webhookconfig.WriteConfigurations(io.Discard, o)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestConfigFlagsShowTheirDefaults(t *testing.T) {
	fs := flag.NewFlagSet("configurations", flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	RegisterConfigFlags(fs, &webhookconfig.ConfigOptions{})
	fs.PrintDefaults()
	for _, want := range []string{"(default stampguard)", "(default Fail)", "(default Ignore)", "(default 2)", "(default kube-system,kube-node-lease,<the --service namespace>)", "(default stampguard:break-glass)", "(default " + webhookconfig.FormatGuardedResources(webhookconfig.DefaultGuardedResources) + ")"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %s:\n%s", want, help.String())
		}
	}
}

// What the defaults route and what they never route, on the path a user
// without Helm takes (`webhook configurations --service ...`).
func TestDefaultConfigurationsAreSafe(t *testing.T) {
	o, err := parseConfigFlags(t, "--service", "stampguard-system/stampguard")
	if err != nil {
		t.Fatal(err)
	}
	mut, val := webhookconfig.Configurations(o)
	t.Run("without a policy nothing is routed, and nothing else is set that a re-apply could overwrite", func(t *testing.T) {
		for name, w := range map[string]struct {
			rules []admissionregistrationv1.RuleWithOperations
			sel   *metav1.LabelSelector
			conds []admissionregistrationv1.MatchCondition
		}{
			"mutating":   {mut.Webhooks[0].Rules, mut.Webhooks[0].NamespaceSelector, mut.Webhooks[0].MatchConditions},
			"validating": {val.Webhooks[0].Rules, val.Webhooks[0].NamespaceSelector, val.Webhooks[0].MatchConditions},
		} {
			if len(w.rules) != 0 || w.sel != nil || len(w.conds) != 0 {
				t.Errorf("%s: rules %+v, selector %v, conditions %+v", name, w.rules, w.sel, w.conds)
			}
		}
	})
	t.Run("the stamp check fails closed, the field rules open", func(t *testing.T) {
		if *mut.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail || *val.Webhooks[0].FailurePolicy != admissionregistrationv1.Ignore {
			t.Errorf("failure policies %s/%s", *mut.Webhooks[0].FailurePolicy, *val.Webhooks[0].FailurePolicy)
		}
	})
	all := o
	all.RouteAll = true
	allMut, allVal := webhookconfig.Configurations(all)
	guarded := o
	guarded.Policies = admissiontest.CompileSet(t, &v1alpha1.ConcurrencyPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "everywhere"},
		Spec: v1alpha1.ConcurrencyPolicySpec{
			Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "secrets"}}, Namespaces: []string{"shop", "kube-system", "stampguard-system"}},
			RequireResourceVersion: true,
			ImmutableFields:        []v1alpha1.ImmutableField{{Path: "type"}},
		},
	})
	polMut, polVal := webhookconfig.Configurations(guarded)
	for name, sel := range map[string]*metav1.LabelSelector{
		"mutating, a policy that names them": polMut.Webhooks[0].NamespaceSelector, "validating, a policy that names them": polVal.Webhooks[0].NamespaceSelector,
		"mutating, every write routed": allMut.Webhooks[0].NamespaceSelector, "validating, every write routed": allVal.Webhooks[0].NamespaceSelector,
	} {
		t.Run(name+": the platform's namespaces and exempt ones are never sent", func(t *testing.T) {
			s, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil {
				t.Fatal(err)
			}
			for _, ns := range []string{"kube-system", "kube-node-lease", "stampguard-system"} {
				if s.Matches(labels.Set{"kubernetes.io/metadata.name": ns}) {
					t.Errorf("namespace %s is sent (%s)", ns, s)
				}
			}
			if s.Matches(labels.Set{"kubernetes.io/metadata.name": "shop", webhookconfig.ExemptLabel: "true"}) {
				t.Errorf("an exempt namespace is sent (%s)", s)
			}
			if !s.Matches(labels.Set{"kubernetes.io/metadata.name": "shop"}) {
				t.Errorf("namespace shop is not sent (%s)", s)
			}
		})
	}
	t.Run("Helm's release records are never sent", func(t *testing.T) {
		for _, w := range [][]admissionregistrationv1.MatchCondition{polMut.Webhooks[0].MatchConditions, polVal.Webhooks[0].MatchConditions,
			allMut.Webhooks[0].MatchConditions, allVal.Webhooks[0].MatchConditions} {
			if !slices.ContainsFunc(w, func(c admissionregistrationv1.MatchCondition) bool {
				return c.Expression == webhookconfig.HelmReleaseCondition
			}) {
				t.Errorf("no Helm release condition in %+v", w)
			}
		}
	})
}

func TestConfigFlagsPolicyFile(t *testing.T) {
	fs := flag.NewFlagSet("webhook configurations", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o webhookconfig.ConfigOptions
	RegisterConfigFlags(fs, &o)
	if err := fs.Parse([]string{"--url", "https://127.0.0.1:9443", "--policy-file", filepath.Join("..", "..", "..", "examples", "policies.yaml")}); err != nil {
		t.Fatal(err)
	}
	if o.Policies == nil || o.Policies.Len() == 0 {
		t.Fatal("--policy-file loaded no policies")
	}
	_, val := webhookconfig.Configurations(o)
	if got := admissiontest.ConditionNames(val.Webhooks[0].MatchConditions); !slices.Contains(got, webhookconfig.FieldsPolicyCondition) {
		t.Fatalf("the configurations are not narrowed by the file's policies: conditions %v", got)
	}
	err := fs.Parse([]string{"--policy-file", "no-such-file.yaml"})
	if err == nil || !strings.Contains(err.Error(), "no-such-file.yaml") {
		t.Fatalf("want an error naming the missing file, got %v", err)
	}
}
