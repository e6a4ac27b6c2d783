package app

import (
	"cmp"
	"flag"
	"fmt"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// RegisterConfigFlags binds the flags of `webhook configurations` to o. Each
// flag writes its own field of o, so ConfigOptions stays the one description
// of the configurations, whoever builds them (this command, the chart's
// helper, the demo). A flag left out leaves its field as it was, so that
// Configurations applies the default (the help text shows it). A flag value
// that cannot be parsed is refused by fs.Parse with the reason; call
// Validate (WriteConfigurations does) for what needs all flags at once.
//
// A new option is a field of ConfigOptions and one fs.Var here.
func RegisterConfigFlags(fs *flag.FlagSet, o *webhookconfig.ConfigOptions) {
	fs.Var(stringValue(&o.Name, webhookconfig.DefaultConfigName), "name", "`name` of both configuration objects")
	fs.Var(funcValue(
		func(s string) error {
			u, err := webhookconfig.ParseWebhookURL(s)
			o.URL = u
			return err
		},
		func() string { return o.URL }),
		"url", "base `URL` of the webhook, https://host[:port][/path] (out-of-cluster); the endpoints' paths are appended. Give --url or --service")
	fs.Var(funcValue(
		func(s string) error {
			svc, err := webhookconfig.ParseServiceReference(s)
			o.Service = svc
			return err
		},
		func() string { return webhookconfig.FormatServiceReference(o.Service) }),
		"service", "in-cluster Service in front of the webhook, `namespace/name[:port]` (port defaults to 443)")
	var caFile string
	fs.Var(funcValue(
		func(s string) error {
			caFile = s
			b, err := webhookconfig.ReadCABundle(s)
			o.CABundle = b
			return err
		},
		func() string { return caFile }),
		"ca-bundle", "PEM `file` with the CA that signed the webhook's serving certificate")
	failurePolicy := func(p *admissionregistrationv1.FailurePolicyType, def admissionregistrationv1.FailurePolicyType) *fnValue {
		return funcValue(
			func(s string) error {
				fp, err := webhookconfig.ParseFailurePolicy(s)
				*p = fp
				return err
			},
			func() string { return string(cmp.Or(*p, def)) })
	}
	fs.Var(failurePolicy(&o.StampFailurePolicy, webhookconfig.DefaultStampFailurePolicy), "stamp-failure-policy",
		"`Fail or Ignore`: what the apiserver does with a routed stampless update while no webhook replica answers")
	fs.Var(failurePolicy(&o.FieldsFailurePolicy, webhookconfig.DefaultFieldsFailurePolicy), "fields-failure-policy",
		"`Fail or Ignore`: the same for the field owner, immutable field and delete precondition checks (every routed create, update and delete)")
	fs.Var(funcValue(
		func(s string) error {
			n, err := strconv.ParseInt(s, 10, 32)
			if err != nil || n < 1 || n > 30 {
				return fmt.Errorf("want whole seconds from 1 to 30 (the apiserver's range)")
			}
			o.TimeoutSeconds = int32(n)
			return nil
		},
		func() string { return strconv.Itoa(int(cmp.Or(o.TimeoutSeconds, webhookconfig.DefaultTimeoutSeconds))) }),
		"timeout-seconds", "how long the apiserver waits for each call, 1 to 30 `seconds`")
	fs.Var(funcValue(
		func(s string) error {
			rs, err := webhookconfig.ParseGuardedResources(s)
			o.Resources = rs
			return err
		},
		func() string {
			if len(o.Resources) == 0 {
				return webhookconfig.FormatGuardedResources(webhookconfig.DefaultGuardedResources)
			}
			return webhookconfig.FormatGuardedResources(o.Resources)
		}),
		"resources", "resources to guard, `group/resource,...` with a bare resource for the core group (e.g. apps/deployments,configmaps); the scale subresource of deployments, statefulsets and replicasets is added")
	fs.Var(stringValue(&o.BreakGlassGroup, webhookconfig.DefaultBreakGlassGroup), "break-glass-group", "`group` whose members are never sent to the webhook (\"-\" disables the exemption)")
	fs.Var(funcValue(
		func(s string) error {
			sel, err := metav1.ParseToLabelSelector(s)
			if err != nil {
				return err
			}
			o.NamespaceSelector = sel
			return nil
		},
		func() string {
			if o.NamespaceSelector == nil {
				return ""
			}
			return metav1.FormatLabelSelector(o.NamespaceSelector)
		}),
		"namespace-selector", "only send writes in namespaces with these `labels`, e.g. 'team=shop,env notin (dev)' (default all namespaces)")
	fs.Var(funcValue(
		func(s string) error {
			ns, err := webhookconfig.ParseNamespaces(s)
			o.ExcludedNamespaces = ns
			return err
		},
		func() string {
			if o.ExcludedNamespaces == nil {
				return strings.Join(policy.DefaultProtectedNamespaces, ",") + ",<the --service namespace>"
			}
			return strings.Join(o.ExcludedNamespaces, ",")
		}),
		"excluded-namespaces", "`namespaces,...` never sent to the webhook, whatever the policies say (\"\" excludes none); namespaces labelled "+webhookconfig.ExemptLabel+"=true are always excluded")
	fs.BoolVar(&o.RouteAll, "route-all", false, "send every write of the --resources to the webhook, whatever the policies (default: only what the --policy-file's policies guard; without one nothing, until the webhook's --sync-configurations fills them in)")
	var policyFile string
	fs.Var(funcValue(
		func(s string) error {
			policyFile = s
			ps, err := policy.LoadFile(s)
			if err != nil {
				return err
			}
			o.Policies = policy.NewSet(ps...)
			return nil
		},
		func() string { return policyFile }),
		"policy-file", "route what the policies in this multi-document YAML `file` guard (the pre-filter, for the webhook's file mode; default: no policy, nothing routed)")
}

// stringValue sets *p; its help text shows def while *p is empty.
func stringValue(p *string, def string) *fnValue {
	return funcValue(func(s string) error { *p = s; return nil }, func() string { return cmp.Or(*p, def) })
}

// funcValue adapts a setter and a getter to flag.Value.
func funcValue(set func(string) error, get func() string) *fnValue {
	return &fnValue{set: set, get: get}
}

type fnValue struct {
	set func(string) error
	get func() string
}

func (v *fnValue) Set(s string) error { return v.set(s) }

func (v *fnValue) String() string {
	if v == nil || v.get == nil { // the flag package calls String on a zero value
		return ""
	}
	return v.get()
}
