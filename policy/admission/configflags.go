package admission

import (
	"cmp"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy"
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
func RegisterConfigFlags(fs *flag.FlagSet, o *ConfigOptions) {
	fs.Var(stringValue(&o.Name, DefaultConfigName), "name", "`name` of both configuration objects")
	fs.Var(funcValue(
		func(s string) error {
			u, err := parseWebhookURL(s)
			o.URL = u
			return err
		},
		func() string { return o.URL }),
		"url", "base `URL` of the webhook, https://host[:port][/path] (out-of-cluster); the endpoints' paths are appended. Give --url or --service")
	fs.Var(funcValue(
		func(s string) error {
			svc, err := ParseServiceReference(s)
			o.Service = svc
			return err
		},
		func() string { return formatService(o.Service) }),
		"service", "in-cluster Service in front of the webhook, `namespace/name[:port]` (port defaults to 443)")
	var caFile string
	fs.Var(funcValue(
		func(s string) error {
			caFile = s
			b, err := ReadCABundle(s)
			o.CABundle = b
			return err
		},
		func() string { return caFile }),
		"ca-bundle", "PEM `file` with the CA that signed the webhook's serving certificate")
	failurePolicy := func(p *admissionregistrationv1.FailurePolicyType, def admissionregistrationv1.FailurePolicyType) *fnValue {
		return funcValue(
			func(s string) error {
				fp, err := parseFailurePolicy(s)
				*p = fp
				return err
			},
			func() string { return string(cmp.Or(*p, def)) })
	}
	fs.Var(failurePolicy(&o.StampFailurePolicy, DefaultStampFailurePolicy), "stamp-failure-policy",
		"`Fail or Ignore`: what the apiserver does with a routed stampless update while no webhook replica answers")
	fs.Var(failurePolicy(&o.FieldsFailurePolicy, DefaultFieldsFailurePolicy), "fields-failure-policy",
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
		func() string { return strconv.Itoa(int(cmp.Or(o.TimeoutSeconds, DefaultTimeoutSeconds))) }),
		"timeout-seconds", "how long the apiserver waits for each call, 1 to 30 `seconds`")
	fs.Var(funcValue(
		func(s string) error {
			rs, err := ParseGuardedResources(s)
			o.Resources = rs
			return err
		},
		func() string {
			if len(o.Resources) == 0 {
				return FormatGuardedResources(DefaultGuardedResources)
			}
			return FormatGuardedResources(o.Resources)
		}),
		"resources", "resources to guard, `group/resource,...` with a bare resource for the core group (e.g. apps/deployments,configmaps); the scale subresource of deployments, statefulsets and replicasets is added")
	fs.Var(stringValue(&o.BreakGlassGroup, DefaultBreakGlassGroup), "break-glass-group", "`group` whose members are never sent to the webhook (\"-\" disables the exemption)")
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
			ns, err := ParseNamespaces(s)
			o.ExcludedNamespaces = ns
			return err
		},
		func() string {
			if o.ExcludedNamespaces == nil {
				return strings.Join(policy.DefaultProtectedNamespaces, ",") + ",<the --service namespace>"
			}
			return strings.Join(o.ExcludedNamespaces, ",")
		}),
		"excluded-namespaces", "`namespaces,...` never sent to the webhook, whatever the policies say (\"\" excludes none); namespaces labelled "+ExemptLabel+"=true are always excluded")
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

// Validate reports every problem of o that Configurations would turn into
// objects the apiserver refuses or that route nothing, after defaulting.
func (o ConfigOptions) Validate() error {
	o.setDefaults()
	var errs []error
	switch {
	case o.URL == "" && o.Service == nil:
		errs = append(errs, errors.New("say where the apiserver reaches the webhook: give a URL (--url) or a Service (--service)"))
	case o.URL != "" && o.Service != nil:
		errs = append(errs, errors.New("give a URL (--url) or a Service (--service), not both"))
	case o.Service != nil && (o.Service.Namespace == "" || o.Service.Name == ""):
		errs = append(errs, errors.New("the Service needs a namespace and a name"))
	case o.URL != "":
		if _, err := parseWebhookURL(o.URL); err != nil {
			errs = append(errs, fmt.Errorf("url %q: %w", o.URL, err))
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(o.Name) {
		errs = append(errs, fmt.Errorf("name %q: %s", o.Name, msg))
	}
	for what, fp := range map[string]admissionregistrationv1.FailurePolicyType{"stamp": o.StampFailurePolicy, "fields": o.FieldsFailurePolicy} {
		if _, err := parseFailurePolicy(string(fp)); err != nil {
			errs = append(errs, fmt.Errorf("%s failure policy %q: %w", what, fp, err))
		}
	}
	for _, ns := range o.ExcludedNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("excluded namespace %q: %s", ns, msgs[0]))
		}
	}
	if o.TimeoutSeconds < 1 || o.TimeoutSeconds > 30 {
		errs = append(errs, fmt.Errorf("timeout %ds: want 1 to 30 seconds", o.TimeoutSeconds))
	}
	for _, r := range o.Resources {
		if err := checkGuardedResource(r); err != nil {
			errs = append(errs, err)
		}
	}
	// The group is spliced into a CEL string literal.
	if strings.ContainsAny(o.BreakGlassGroup, `'\`+"\n") {
		errs = append(errs, fmt.Errorf("break-glass group %q: quotes, backslashes and newlines are not allowed", o.BreakGlassGroup))
	}
	if len(o.CABundle) > 0 && !x509.NewCertPool().AppendCertsFromPEM(o.CABundle) {
		errs = append(errs, errors.New("the CA bundle holds no PEM certificate"))
	}
	return errors.Join(errs...)
}

// WriteConfigurations writes exactly what Configurations(o) builds as a
// YAML stream of two documents, the MutatingWebhookConfiguration and then
// the ValidatingWebhookConfiguration, ready for `kubectl apply -f -`.
func WriteConfigurations(w io.Writer, o ConfigOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	mut, val := Configurations(o)
	for i, obj := range []any{mut, val} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("encode webhook configuration: %w", err)
		}
		if i > 0 {
			b = append([]byte("---\n"), b...)
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("write webhook configurations: %w", err)
		}
	}
	return nil
}

// ParseServiceReference reads namespace/name[:port]; the port defaults to
// 443, as the apiserver's does.
func ParseServiceReference(s string) (*admissionregistrationv1.ServiceReference, error) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok {
		return nil, fmt.Errorf("want namespace/name[:port], got %q", s)
	}
	name, portText, hasPort := strings.Cut(rest, ":")
	svc := &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name}
	for what, v := range map[string]string{"namespace": ns, "name": name} {
		if msgs := validation.IsDNS1123Label(v); len(msgs) > 0 {
			return nil, fmt.Errorf("service %s %q: %s", what, v, msgs[0])
		}
	}
	if hasPort {
		p, err := strconv.Atoi(portText)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("service port %q: want 1 to 65535", portText)
		}
		port := int32(p)
		svc.Port = &port
	}
	return svc, nil
}

func formatService(svc *admissionregistrationv1.ServiceReference) string {
	if svc == nil {
		return ""
	}
	s := svc.Namespace + "/" + svc.Name
	if svc.Port != nil {
		s += ":" + strconv.Itoa(int(*svc.Port))
	}
	return s
}

// ParseGuardedResources reads a comma-separated list of group/resource
// (a bare resource is in the core group), e.g. "apps/deployments,configmaps".
func ParseGuardedResources(s string) ([]GuardedResource, error) {
	var out []GuardedResource
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("empty item in %q: want group/resource,... such as apps/deployments,configmaps", s)
		}
		r := GuardedResource{Resource: item}
		if g, res, ok := strings.Cut(item, "/"); ok {
			r = GuardedResource{Group: g, Resource: res}
		}
		if err := checkGuardedResource(r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func checkGuardedResource(r GuardedResource) error {
	name := FormatGuardedResources([]GuardedResource{r})
	switch {
	case strings.Contains(r.Resource, "/"):
		return fmt.Errorf("resource %q: name the resource without a subresource; the scale subresource of the workloads is added", name)
	case r.Resource == "*" || r.Group == "*":
		return fmt.Errorf("resource %q: name resources; a wildcard would send every write in the cluster, leases and events included, to the webhook", name)
	case r.Resource == "leases" || r.Resource == "events":
		return fmt.Errorf("resource %q: leader election and event recording are the platform's own machinery and are never guarded", name)
	}
	if msgs := validation.IsDNS1123Label(r.Resource); len(msgs) > 0 {
		return fmt.Errorf("resource %q: %s (want the lowercase plural, e.g. deployments)", name, msgs[0])
	}
	if r.Group != "" {
		if msgs := validation.IsDNS1123Subdomain(r.Group); len(msgs) > 0 {
			return fmt.Errorf("resource %q: group: %s", name, msgs[0])
		}
	}
	return nil
}

// FormatGuardedResources is the inverse of ParseGuardedResources.
func FormatGuardedResources(rs []GuardedResource) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Resource
		if r.Group != "" {
			parts[i] = r.Group + "/" + r.Resource
		}
	}
	return strings.Join(parts, ",")
}

// ParseNamespaces reads a comma-separated list of namespace names; the
// empty string is the empty list.
func ParseNamespaces(s string) ([]string, error) {
	out := []string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if msgs := validation.IsDNS1123Label(item); len(msgs) > 0 {
			return nil, fmt.Errorf("namespace %q: %s", item, msgs[0])
		}
		out = append(out, item)
	}
	return out, nil
}

// ReadCABundle reads a PEM file that must hold at least one certificate.
func ReadCABundle(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", path)
	}
	return b, nil
}

func parseFailurePolicy(s string) (admissionregistrationv1.FailurePolicyType, error) {
	switch fp := admissionregistrationv1.FailurePolicyType(s); fp {
	case admissionregistrationv1.Fail, admissionregistrationv1.Ignore:
		return fp, nil
	}
	return "", errors.New("want Fail or Ignore")
}

// parseWebhookURL checks what the apiserver requires of a webhook URL and
// drops a trailing slash, since the endpoints' paths are appended.
func parseWebhookURL(s string) (string, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", err
	case u.Scheme != "https":
		return "", errors.New("want an https:// URL: the apiserver calls webhooks over TLS only")
	case u.Host == "":
		return "", errors.New("the URL names no host")
	case u.User != nil, u.RawQuery != "", u.Fragment != "":
		return "", errors.New("the apiserver refuses webhook URLs with user info, a query or a fragment")
	}
	return strings.TrimSuffix(s, "/"), nil
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
