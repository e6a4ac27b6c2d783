package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/internal/rawjson"
)

// Violation is one rule that a request breaks.
type Violation struct {
	Policy string
	Rule   RuleKind
	// Index is the rule's position in fieldOwners or immutableFields, -1
	// for the stamp and delete rules.
	Index  int
	Action v1alpha1.Action
	Path   string
	Writer string
	// Message is the sentence a client sees.
	Message string
}

// Decision is the outcome of one evaluation: every rule the request broke,
// across all matching policies, in a deterministic order.
type Decision struct {
	Violations []Violation
}

// Action is the strictest action among the violations, "" when there are none.
func (d Decision) Action() v1alpha1.Action {
	var out v1alpha1.Action
	for _, v := range d.Violations {
		if strictness(v.Action) > strictness(out) {
			out = v.Action
		}
	}
	return out
}

func strictness(a v1alpha1.Action) int {
	switch a {
	case v1alpha1.ActionDeny:
		return 3
	case v1alpha1.ActionWarn:
		return 2
	case v1alpha1.ActionAudit:
		return 1
	}
	return 0
}

// NamespaceLabels looks up a namespace's labels for namespaceSelector.
type NamespaceLabels interface {
	Labels(namespace string) (labels.Set, bool)
}

// Environment is what evaluation needs beyond the request and the policies.
type Environment struct {
	// ProtectedNamespaces are skipped unless a policy names them: the
	// webhook's own namespace, kube-system and kube-node-lease.
	ProtectedNamespaces []string
	// BreakGlassGroup members bypass every policy. Empty disables it.
	BreakGlassGroup string
	// Namespaces resolves namespaceSelector; nil means no namespace matches
	// a selector.
	Namespaces NamespaceLabels
}

// DefaultProtectedNamespaces are always protected; the webhook adds its own.
var DefaultProtectedNamespaces = []string{"kube-system", "kube-node-lease"}

// Set is an immutable, ordered collection of compiled policies.
type Set struct {
	policies []*Policy
	tree     pathTree
	index    map[string]int32 // rule path text -> index in tree
}

// NewSet orders the policies by name so that decisions are deterministic.
func NewSet(policies ...*Policy) *Set {
	ps := slices.Clone(policies)
	slices.SortFunc(ps, func(a, b *Policy) int { return strings.Compare(a.Name, b.Name) })
	s := &Set{policies: ps, index: map[string]int32{}}
	add := func(p FieldPath) {
		if _, ok := s.index[p.text]; !ok {
			i := int32(len(s.index))
			s.index[p.text] = i
			s.tree.add(p, i)
		}
	}
	add(resourceVersionPath)
	for _, p := range ps {
		for _, r := range p.owners {
			add(r.path)
		}
		for _, r := range p.immutables {
			add(r.path)
		}
	}
	s.tree.finish()
	return s
}

// Len is the number of policies.
func (s *Set) Len() int { return len(s.policies) }

// Names lists the policy names in order.
func (s *Set) Names() []string {
	out := make([]string, len(s.policies))
	for i, p := range s.policies {
		out[i] = p.Name
	}
	return out
}

// matchScope says how much of a policy applies to a request.
type matchScope uint8

const (
	noMatch      matchScope = iota
	fullMatch               // the resource itself, or a named subresource
	replicasOnly            // the scale subresource of a guarded workload: its stamp and spec.replicas
)

func (p *Policy) applies(req *Request, env *Environment) matchScope {
	scope := noMatch
	for _, r := range p.resources {
		if r.matches(req.Group, req.Resource, req.SubResource) {
			scope = fullMatch
			break
		}
		if req.SubResource == "scale" && isScalableWorkload(req.Group, req.Resource) && r.matches(req.Group, req.Resource, "") {
			scope = replicasOnly
		}
	}
	if scope == noMatch || !p.coversNamespace(req.Namespace, env) {
		return noMatch
	}
	if env.BreakGlassGroup != "" && slices.Contains(req.User.Groups, env.BreakGlassGroup) {
		return noMatch
	}
	if req.User.in(p.excludeUsers, p.excludeGroups) {
		return noMatch
	}
	return scope
}

// isScalableWorkload lists the kinds whose spec.replicas the HPA and
// kubectl scale write through the scale subresource.
func isScalableWorkload(group, resource string) bool {
	return group == "apps" && (resource == "deployments" || resource == "statefulsets" || resource == "replicasets")
}

func (p *Policy) coversNamespace(ns string, env *Environment) bool {
	if ns == "" {
		return len(p.namespaces) == 0 && p.namespaceSelector == nil
	}
	if len(p.namespaces) > 0 {
		if _, ok := slices.BinarySearch(p.namespaces, ns); !ok {
			return false
		}
	} else if slices.Contains(env.ProtectedNamespaces, ns) {
		return false
	}
	if p.namespaceSelector != nil {
		if env.Namespaces == nil {
			return false
		}
		set, _ := env.Namespaces.Labels(ns)
		return p.namespaceSelector.Matches(set)
	}
	return true
}

// Guards reports whether any policy has a rule for this kind of request, so
// the caller can pass everything else without reading the objects.
func (s *Set) Guards(req *Request, env *Environment) bool {
	for _, p := range s.policies {
		if p.applies(req, env) != noMatch {
			return true
		}
	}
	return false
}

// CheckStamp evaluates the stamp rule: an update must carry the
// resourceVersion it read. Only the mutating phase can see this; by the
// validating phase the apiserver has filled the stored stamp in.
func (s *Set) CheckStamp(req *Request, env *Environment) (Decision, error) {
	var d Decision
	if req.Operation != Update {
		return d, nil
	}
	stampChecked, stamped := false, false
	for _, p := range s.policies {
		// A policy on a workload also guards its scale subresource: a Scale
		// carries the workload's resourceVersion, and a stampless Scale PUT
		// overwrites spec.replicas unconditionally.
		if p.stamp == nil || p.applies(req, env) == noMatch {
			continue
		}
		if !stampChecked {
			var err error
			stamped, err = s.hasStamp(req)
			if err != nil {
				return d, err
			}
			stampChecked = true
		}
		if stamped {
			return d, nil
		}
		d.Violations = append(d.Violations, Violation{
			Policy: p.Name, Rule: RuleStampMissing, Index: -1, Action: p.stamp.action,
			Path: "metadata.resourceVersion", Writer: req.User.Name,
			Message: fmt.Sprintf("ConcurrencyPolicy %q: metadata.resourceVersion: Invalid value: \"\": must be specified for an update", p.Name),
		})
	}
	return d, nil
}

var resourceVersionPath = mustPath("metadata.resourceVersion")

func (s *Set) hasStamp(req *Request) (bool, error) {
	var vals [][]byte
	if req.scanned[curObject] {
		vals = valuesOf(req.extracted[curObject], s.index[resourceVersionPath.text], nil)
	} else {
		var err error
		if vals, err = resourceVersionPath.Values(req.Object, nil); err != nil {
			return false, fmt.Errorf("read metadata.resourceVersion: %w", err)
		}
	}
	if len(vals) == 0 {
		return false, nil
	}
	rv, err := rawjson.String(vals[0])
	if err != nil {
		return false, fmt.Errorf("read metadata.resourceVersion: %w", err)
	}
	return rv != "", nil
}

// CheckFields evaluates field owners, immutable fields and delete
// preconditions: the validating phase.
func (s *Set) CheckFields(req *Request, env *Environment) (Decision, error) {
	var d Decision
	ev := fieldEvaluation{req: req, set: s}
	for _, p := range s.policies {
		scope := p.applies(req, env)
		if scope == noMatch {
			continue
		}
		var err error
		switch req.Operation {
		case Update, Create:
			err = ev.checkOwners(p, scope, &d)
			if err == nil && req.Operation == Update {
				err = ev.checkImmutables(p, scope, &d)
			}
		case Delete:
			if scope == fullMatch {
				err = ev.checkDelete(p, &d)
			}
		}
		if err != nil {
			return Decision{}, fmt.Errorf("ConcurrencyPolicy %q: %w", p.Name, err)
		}
	}
	return d, nil
}

// fieldEvaluation holds what one request's objects hold: each object is
// walked once for the paths of every rule in the set, on first need.
type fieldEvaluation struct {
	req          *Request
	set          *Set
	extracted    bool
	old, cur     []valueRef
	scratch      [2][4][]byte // backing for the values of one rule
	fieldManager *string
}

func (ev *fieldEvaluation) values(p FieldPath) (old, cur [][]byte, err error) {
	if !ev.extracted {
		ev.extracted = true
		ev.cur, err = ev.set.extracted(ev.req, curObject)
		if err == nil && ev.req.Operation == Update {
			ev.old, err = ev.set.extracted(ev.req, oldObject)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	i := ev.set.index[p.text]
	return valuesOf(ev.old, i, ev.scratch[0][:0]), valuesOf(ev.cur, i, ev.scratch[1][:0]), nil
}

func (s *Set) extracted(req *Request, which int) ([]valueRef, error) {
	if req.scanned[which] {
		return req.extracted[which], nil
	}
	doc, name := req.Object, "object"
	if which == oldObject {
		doc, name = req.OldObject, "oldObject"
	}
	refs, err := s.tree.extract(doc, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return refs, nil
}

// ScanObject reads the object (or, with old, the oldObject) that starts at
// data[start:] while a caller decodes the AdmissionReview around it: the
// values every rule needs are extracted in the same pass that finds the
// object's end, which it returns. The object is kept as raw bytes.
func (s *Set) ScanObject(req *Request, old bool, data []byte, start int) (int, error) {
	which := curObject
	if old {
		which = oldObject
	}
	start = skipWS(data, start)
	refs := req.extracted[which][:0]
	if refs == nil {
		refs = make([]valueRef, 0, 2*len(s.index))
	}
	end, refs, err := s.tree.walk(data, start, refs)
	if err != nil {
		return 0, err
	}
	raw := data[start:end]
	if rawjson.IsNull(raw) {
		raw, refs = nil, nil
	}
	if old {
		req.OldObject = raw
	} else {
		req.Object = raw
	}
	req.extracted[which], req.scanned[which] = refs, true
	return end, nil
}

func (ev *fieldEvaluation) manager() string {
	if ev.fieldManager == nil {
		var fm string
		if len(ev.req.Options) > 0 && rawjson.Kind(ev.req.Options) == '{' {
			if v, ok, err := rawjson.Member(ev.req.Options, "fieldManager"); err == nil && ok {
				fm, _ = rawjson.String(v)
			}
		}
		ev.fieldManager = &fm
	}
	return *ev.fieldManager
}

func (ev *fieldEvaluation) checkOwners(p *Policy, scope matchScope, d *Decision) error {
	for i := range p.owners {
		r := &p.owners[i]
		if ev.req.Operation == Create && !r.onCreate {
			continue
		}
		if scope == replicasOnly && !r.path.pathIs("spec", "replicas") {
			continue
		}
		old, cur, err := ev.values(r.path)
		if err != nil {
			return err
		}
		if sameValues(old, cur) || r.writers.allows(ev.req.User, ev.manager()) {
			continue
		}
		d.Violations = append(d.Violations, Violation{
			Policy: p.Name, Rule: RuleFieldOwner, Index: r.index, Action: r.action,
			Path: r.path.text, Writer: ev.req.User.Name,
			Message: fmt.Sprintf("ConcurrencyPolicy %q: %s is owned by %s; %s may not change it (%s -> %s)",
				p.Name, r.path.text, r.writers.display, ev.req.User.Name, showValues(old), showValues(cur)),
		})
	}
	return nil
}

func (ev *fieldEvaluation) checkImmutables(p *Policy, scope matchScope, d *Decision) error {
	for i := range p.immutables {
		r := &p.immutables[i]
		if scope == replicasOnly && !r.path.pathIs("spec", "replicas") {
			continue
		}
		old, cur, err := ev.values(r.path)
		if err != nil {
			return err
		}
		if sameValues(old, cur) || (r.mode == v1alpha1.ImmutableOnceSet && len(old) == 0) {
			continue
		}
		what := "immutable"
		if r.mode == v1alpha1.ImmutableOnceSet {
			what = "immutable once set"
		}
		d.Violations = append(d.Violations, Violation{
			Policy: p.Name, Rule: RuleImmutableField, Index: r.index, Action: r.action,
			Path: r.path.text, Writer: ev.req.User.Name,
			Message: fmt.Sprintf("ConcurrencyPolicy %q: %s is %s; %s may not change it (%s -> %s)",
				p.Name, r.path.text, what, ev.req.User.Name, showValues(old), showValues(cur)),
		})
	}
	return nil
}

func (ev *fieldEvaluation) checkDelete(p *Policy, d *Decision) error {
	r := p.delete
	if r == nil {
		return nil
	}
	if slices.Contains(r.exemptUsers, ev.req.User.Name) {
		return nil
	}
	if ev.req.Name == "" && r.collectionExempt {
		return nil // an item of a deletecollection: it cannot carry preconditions
	}
	uid, rv, err := preconditions(ev.req.Options)
	if err != nil {
		return err
	}
	want, have := "uid", uid
	if r.require == v1alpha1.DeletePreconditionResourceVersion {
		want, have = "resourceVersion", rv
	}
	if have != "" {
		return nil
	}
	d.Violations = append(d.Violations, Violation{
		Policy: p.Name, Rule: RuleDeletePrecondition, Index: -1, Action: r.action,
		Path: "preconditions." + want, Writer: ev.req.User.Name,
		Message: fmt.Sprintf("ConcurrencyPolicy %q: deletes of %s must carry a %s precondition; %s sent none",
			p.Name, resourceName(ev.req.Group, ev.req.Resource), want, ev.req.User.Name),
	})
	return nil
}

func preconditions(options []byte) (uid, rv string, err error) {
	if rawjson.Kind(options) != '{' {
		return "", "", nil
	}
	pre, ok, err := rawjson.Member(options, "preconditions")
	if err != nil || !ok || rawjson.Kind(pre) != '{' {
		return "", "", err
	}
	err = rawjson.ObjectEach(pre, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "uid"):
			uid, err = rawjson.String(v)
		case rawjson.KeyIs(k, "resourceVersion"):
			rv, err = rawjson.String(v)
		}
		return err == nil
	})
	if err != nil {
		return "", "", fmt.Errorf("read delete preconditions: %w", err)
	}
	return uid, rv, nil
}

func resourceName(group, resource string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

func sameValues(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !rawjson.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// maxShownValue keeps denial messages readable when a rule names a large
// value such as a whole container list.
const maxShownValue = 80

func showValues(vals [][]byte) string {
	switch len(vals) {
	case 0:
		return "<unset>"
	case 1:
		return showValue(vals[0])
	}
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = showValue(v)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func showValue(v []byte) string {
	v = rawjson.Trim(v)
	var buf bytes.Buffer
	s := string(v)
	// Compact is only for display; a value it cannot compact shows as is.
	if len(v) <= 64*maxShownValue && json.Compact(&buf, v) == nil {
		s = buf.String()
	}
	if len(s) > maxShownValue {
		s = strings.ToValidUTF8(s[:maxShownValue], "") + "..."
	}
	return s
}

func mustPath(s string) FieldPath {
	p, err := ParseFieldPath(s)
	if err != nil {
		panic(err) // only for constant paths in this package
	}
	return p
}
