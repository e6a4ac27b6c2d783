package webhookconfig

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

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
		if _, err := ParseWebhookURL(o.URL); err != nil {
			errs = append(errs, fmt.Errorf("url %q: %w", o.URL, err))
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(o.Name) {
		errs = append(errs, fmt.Errorf("name %q: %s", o.Name, msg))
	}
	for what, fp := range map[string]admissionregistrationv1.FailurePolicyType{"stamp": o.StampFailurePolicy, "fields": o.FieldsFailurePolicy} {
		if _, err := ParseFailurePolicy(string(fp)); err != nil {
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

// FormatServiceReference is the inverse of ParseServiceReference; nil is "".
func FormatServiceReference(svc *admissionregistrationv1.ServiceReference) string {
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

// ParseFailurePolicy reads Fail or Ignore.
func ParseFailurePolicy(s string) (admissionregistrationv1.FailurePolicyType, error) {
	switch fp := admissionregistrationv1.FailurePolicyType(s); fp {
	case admissionregistrationv1.Fail, admissionregistrationv1.Ignore:
		return fp, nil
	}
	return "", errors.New("want Fail or Ignore")
}

// ParseWebhookURL checks what the apiserver requires of a webhook URL and
// drops a trailing slash, since the endpoints' paths are appended.
func ParseWebhookURL(s string) (string, error) {
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
