package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
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

// RuleName names the violated rule inside its policy, in the spec's own
// words: requireResourceVersion, requireDeletePreconditions,
// fieldOwners[i], immutableFields[i]. The audit annotations carry it.
func (v Violation) RuleName() string {
	for _, k := range ruleKinds {
		if k.kind == v.Rule {
			return k.name(v.Index)
		}
	}
	return string(v.Rule)
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

// DefaultProtectedNamespaces are always protected, the cluster's own
// machinery lives there; the webhook adds its own namespace. The webhook
// configurations exclude them too (webhookconfig.ConfigOptions'
// ExcludedNamespaces defaults to them).
var DefaultProtectedNamespaces = []string{"kube-system", "kube-node-lease"}

// Set is an immutable, ordered collection of compiled policies.
type Set struct {
	policies []*Policy
	tree     pathTree
	index    map[string]int32 // rule path text -> index in tree
	// byNamespace lists, per namespace, the policies that name it in
	// match.namespaces; anyNamespace the policies that name none. A
	// request is checked against those two lists alone: a policy that
	// names namespaces covers no other (coversNamespace), so a set of
	// many per-namespace policies costs per request what the request's
	// namespace holds.
	byNamespace  map[string][]int32
	anyNamespace []int32
}

// NewSet orders the policies by name so that decisions are deterministic.
func NewSet(policies ...*Policy) *Set {
	ps := slices.Clone(policies)
	slices.SortFunc(ps, func(a, b *Policy) int { return strings.Compare(a.Name, b.Name) })
	s := &Set{policies: ps, index: map[string]int32{}, byNamespace: map[string][]int32{}}
	for i, p := range ps {
		if len(p.namespaces) == 0 {
			s.anyNamespace = append(s.anyNamespace, int32(i))
		}
		for _, ns := range p.namespaces {
			if l := s.byNamespace[ns]; len(l) == 0 || l[len(l)-1] != int32(i) {
				s.byNamespace[ns] = append(l, int32(i))
			}
		}
	}
	add := func(p FieldPath) {
		if _, ok := s.index[p.text]; !ok {
			i := int32(len(s.index))
			s.index[p.text] = i
			s.tree.add(p, i)
		}
	}
	add(resourceVersionPath) // always, first: ScanObject extracts it for any set
	for _, p := range ps {
		for _, r := range p.rules {
			for _, fp := range r.paths() {
				add(fp)
			}
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
		if req.SubResource == "scale" && IsScalableWorkload(req.Group, req.Resource) && r.matches(req.Group, req.Resource, "") {
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

// ScalableWorkloads are the apps resources whose spec.replicas the HPA and
// kubectl scale write through the scale subresource: a policy on one of
// them guards that subresource too, and the webhook configurations route it
// with them.
var ScalableWorkloads = []string{"deployments", "statefulsets", "replicasets"}

// IsScalableWorkload reports whether a resource is one of ScalableWorkloads.
func IsScalableWorkload(group, resource string) bool {
	return group == "apps" && slices.Contains(ScalableWorkloads, resource)
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

// CheckStamp evaluates the stamp rule: the mutating phase.
func (s *Set) CheckStamp(req *Request, env *Environment) (Decision, error) {
	d, _, err := s.check(phaseStamp, req, env)
	return d, err
}

// CheckFields evaluates field owners, immutable fields and delete
// preconditions: the validating phase.
func (s *Set) CheckFields(req *Request, env *Environment) (Decision, error) {
	d, p, err := s.check(phaseFields, req, env)
	if err != nil {
		return Decision{}, fmt.Errorf("ConcurrencyPolicy %q: %w", p.Name, err)
	}
	return d, nil
}

// check evaluates a phase's rules of every policy that applies, in order.
// An error comes with the policy whose rule could not be evaluated.
func (s *Set) check(ph phase, req *Request, env *Environment) (Decision, *Policy, error) {
	var d Decision
	var ev *evaluation // on first need
	defer func() {
		if ev != nil {
			*ev = evaluation{} // holds nothing of the request
			evaluations.Put(ev)
		}
	}()
	for p, r := range s.checked(ph, req, env) {
		if ev == nil {
			ev = evaluations.Get().(*evaluation)
			ev.req, ev.set = req, s
		}
		v, broken, err := r.check(ev, p.Name)
		if err != nil {
			return Decision{}, p, err
		}
		if broken {
			d.Violations = append(d.Violations, v)
		}
	}
	return d, nil, nil
}

// checked yields the rules of a phase that check evaluates for req, with
// their policies, in order: those of the policies that apply, that check
// its operation in its scope.
func (s *Set) checked(ph phase, req *Request, env *Environment) iter.Seq2[*Policy, rule] {
	return func(yield func(*Policy, rule) bool) {
		// The two candidate lists merged, in the set's order.
		named, rest := s.byNamespace[req.Namespace], s.anyNamespace
		if req.Namespace == "" {
			named = nil
		}
		for len(named) > 0 || len(rest) > 0 {
			var i int32
			if len(rest) == 0 || (len(named) > 0 && named[0] < rest[0]) {
				i, named = named[0], named[1:]
			} else {
				i, rest = rest[0], rest[1:]
			}
			p := s.policies[i]
			if !p.checksOperation(ph, req.Operation) {
				continue // before applies, which costs more
			}
			scope := p.applies(req, env)
			if scope == noMatch {
				continue
			}
			for _, r := range p.rules { // not rulesIn: nested, it allocates
				if r.phase() == ph && checks(r, req.Operation, scope) && !yield(p, r) {
					return
				}
			}
		}
	}
}

// evaluations are reused: passed to the rules through their interface, an
// evaluation escapes, and would cost an allocation per request.
var evaluations = sync.Pool{New: func() any { return new(evaluation) }}

// evaluation holds what one request's objects hold: each object is
// walked once for the paths of every rule in the set, on first need.
type evaluation struct {
	req          *Request
	set          *Set
	extracted    bool
	old, cur     []valueRef
	scratch      [2][4][]byte // backing for the values of one rule
	fieldManager *string
	stampRead    bool // stamped holds whether the object carries a resourceVersion
	stamped      bool
}

func (ev *evaluation) values(p FieldPath) (old, cur [][]byte, err error) {
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

func (ev *evaluation) manager() string {
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

// RuleRef names one rule of one policy, as a Violation does.
type RuleRef struct {
	Policy string
	Rule   RuleKind
	// Index is the rule's position in fieldOwners or immutableFields, -1
	// for the stamp and delete rules.
	Index  int
	Action v1alpha1.Action
}

// RuleName is the rule's name in the spec's words, as Violation.RuleName.
func (r RuleRef) RuleName() string {
	return Violation{Rule: r.Rule, Index: r.Index}.RuleName()
}

// StampRules lists the rules CheckStamp evaluates for req, in its order.
func (s *Set) StampRules(req *Request, env *Environment) []RuleRef {
	return s.rulesFor(phaseStamp, req, env)
}

// FieldRules lists the rules CheckFields evaluates for req, in its order:
// what a replay that lacks the objects counts as undecidable, and what it
// counts as allowed when they break nothing.
func (s *Set) FieldRules(req *Request, env *Environment) []RuleRef {
	return s.rulesFor(phaseFields, req, env)
}

func (s *Set) rulesFor(ph phase, req *Request, env *Environment) []RuleRef {
	var out []RuleRef
	for p, r := range s.checked(ph, req, env) {
		ref := r.ref()
		ref.Policy = p.Name
		out = append(out, ref)
	}
	return out
}
