package policy

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The pre-filter: a policy set compiled into what a webhook configuration
// can say (rules, namespaceSelector, a CEL matchCondition), so that the
// apiserver calls the webhook only for writes that could break a policy.
//
// Safety: whenever CheckFields (CheckStamp) finds a violation of any action,
// the compiled condition is true. Every piece below is either exact or an
// over-approximation of the Go evaluation (it may call the webhook for a
// write that breaks nothing, never skip one that breaks a rule); what cannot
// be compiled exactly becomes true. The webhook still decides.

// PrefilterOptions shape the compiled pre-filter.
type PrefilterOptions struct {
	// Resources the configurations route to the webhook (top-level
	// resources). Policies on other resources are never called, as without
	// the pre-filter. Required.
	Resources []schema.GroupResource
	// ProtectedNamespaces are skipped by policies that name no namespace,
	// as Environment.ProtectedNamespaces. Defaults to
	// DefaultProtectedNamespaces. Leaving the webhook's own namespace out
	// only calls the webhook more often.
	ProtectedNamespaces []string
	// MaxConditionBytes bounds a compiled condition; a longer one falls
	// back to which policies apply, then to true (always call), which
	// keeps it within what the apiserver accepts. Defaults to
	// DefaultMaxConditionBytes.
	MaxConditionBytes int
}

// DefaultMaxConditionBytes bounds a compiled condition. The apiserver
// refuses an expression of more than 100,000 code points ("expression code
// point size exceeds limit", checked on kube-apiserver 1.37.2); it accepted
// 72 KB built from 45 policies with 90 comprehensions over the writer's
// groups, so its cost estimate does not bind first.
const DefaultMaxConditionBytes = 64 << 10

// Prefilter is what the stamp and the fields webhooks need to know.
type Prefilter struct {
	Stamp, Fields WebhookFilter
}

// WebhookFilter narrows one webhook of the configurations.
type WebhookFilter struct {
	// Resources to route, in the order of PrefilterOptions.Resources; a
	// workload's scale subresource shows as "deployments/scale". Empty: no
	// policy needs this webhook.
	Resources []schema.GroupResource
	// Operations to route.
	Operations []Operation
	// Namespaces, when not nil, are the only namespaces the webhook needs
	// to see (every policy names its namespaces).
	Namespaces []string
	// ExcludedNamespaces, when not nil, need never be sent (no policy
	// names a namespace, so the protected ones are skipped by all).
	ExcludedNamespaces []string
	// NamespaceSelector is the selector of the only policy, when it has one.
	NamespaceSelector *metav1.LabelSelector
	// Condition is a CEL expression over object, oldObject and request
	// that is true for every write that could break a policy. Past
	// MaxConditionBytes it only says which policies apply, and past that
	// again it is "true".
	Condition string
	// Exact is false when Condition was too large and fell back to which
	// policies apply (or to "true"), without the rules.
	Exact bool
}

// Prefilter compiles the set for the webhook configurations.
func (s *Set) Prefilter(o PrefilterOptions) Prefilter {
	if o.ProtectedNamespaces == nil {
		o.ProtectedNamespaces = DefaultProtectedNamespaces
	}
	if o.MaxConditionBytes <= 0 {
		o.MaxConditionBytes = DefaultMaxConditionBytes
	}
	c := prefilterCompiler{o: o}
	return Prefilter{Stamp: c.webhook(s, phaseStamp), Fields: c.webhook(s, phaseFields)}
}

type prefilterCompiler struct{ o PrefilterOptions }

// webhook compiles the filter of a phase's webhook from the policies with
// rules in that phase.
func (c *prefilterCompiler) webhook(s *Set, ph phase) WebhookFilter {
	var ps []*Policy
	for _, p := range s.policies {
		if p.has(ph) {
			ps = append(ps, p)
		}
	}
	f := WebhookFilter{Exact: true}
	ops := map[Operation]bool{}
	for _, gr := range c.o.Resources {
		var top, scale bool
		for _, p := range ps {
			if p.matchesResource(gr.Group, gr.Resource, "") {
				top = true
				for r := range p.rulesIn(ph) {
					for _, op := range r.operations() {
						ops[op] = true
					}
				}
			}
			// A Scale carries its workload's stamp and spec.replicas: a
			// policy on the scale subresource, or one on the workload with
			// a rule there, may check it. A Scale is only ever updated.
			if IsScalableWorkload(gr.Group, gr.Resource) && (p.matchesResource(gr.Group, gr.Resource, "scale") ||
				(p.matchesResource(gr.Group, gr.Resource, "") && p.checksScale(ph))) {
				scale = true
				ops[Update] = true
			}
		}
		if top {
			f.Resources = append(f.Resources, gr)
		}
		if scale {
			f.Resources = append(f.Resources, schema.GroupResource{Group: gr.Group, Resource: gr.Resource + "/scale"})
		}
	}
	if len(f.Resources) == 0 {
		f.Condition = "false"
		return f
	}
	for _, op := range []Operation{Create, Update, Delete} {
		if ops[op] {
			f.Operations = append(f.Operations, op)
		}
	}
	c.narrowNamespaces(&f, ps)
	var terms, coarse []string
	for _, p := range ps {
		match := c.policyMatch(p)
		coarse = append(coarse, match)
		var rules []string
		for r := range p.rulesIn(ph) {
			rules = append(rules, r.condition())
		}
		terms = append(terms, and(match, or(rules)))
	}
	c.finish(&f, terms, coarse)
	return f
}

// finish joins the per-policy terms. Past the size bound it falls back to
// the coarse terms (which policies apply, not which rules could break),
// then to true.
func (c *prefilterCompiler) finish(f *WebhookFilter, terms, coarse []string) {
	f.Condition = or(terms)
	if len(f.Condition) <= c.o.MaxConditionBytes {
		return
	}
	f.Exact = false
	if f.Condition = or(coarse); len(f.Condition) > c.o.MaxConditionBytes {
		f.Condition = "true"
	}
}

// narrowNamespaces fills the namespace fields of f for the policies ps.
// The webhook's namespaceSelector matches a Namespace object by its own
// labels, which the evaluator does not; so a webhook that routes
// namespaces themselves is not narrowed.
func (c *prefilterCompiler) narrowNamespaces(f *WebhookFilter, ps []*Policy) {
	if slices.Contains(f.Resources, schema.GroupResource{Resource: "namespaces"}) {
		return
	}
	allNamed, noneNamed := true, true
	var names []string
	for _, p := range ps {
		if len(p.namespaces) == 0 {
			allNamed = false
		} else {
			noneNamed = false
			names = append(names, p.namespaces...)
		}
	}
	// A name that is no namespace name matches no namespace; the
	// apiserver would refuse it in a selector.
	names = slices.DeleteFunc(names, func(n string) bool { return len(validation.IsDNS1123Label(n)) > 0 })
	switch {
	case allNamed && len(names) > 0:
		slices.Sort(names)
		f.Namespaces = slices.Compact(names)
	case noneNamed && len(c.o.ProtectedNamespaces) > 0:
		if excluded := slices.DeleteFunc(sortedCopy(c.o.ProtectedNamespaces), func(n string) bool {
			return len(validation.IsDNS1123Label(n)) > 0
		}); len(excluded) > 0 {
			f.ExcludedNamespaces = excluded
		}
	}
	if len(ps) == 1 && ps[0].namespaceSelector != nil && ps[0].selectorSource != nil {
		f.NamespaceSelector = ps[0].selectorSource.DeepCopy()
	}
}

// policyMatch is true for every request the policy applies to (applies()
// != noMatch), apart from the break-glass group, which has a condition of
// its own. Resources are only told apart by name: the rules route nothing
// else, and over-matching is safe.
func (c *prefilterCompiler) policyMatch(p *Policy) string {
	var res []string
	for _, r := range p.resources {
		switch {
		case r.resource == "*":
			res = append(res, groupIs(r.group))
		case r.sub == "":
			res = append(res, and(groupIs(r.group), "request.resource.resource == "+celString(r.resource)))
		case r.sub == "*" || r.sub == "scale":
			res = append(res, and(groupIs(r.group), "request.resource.resource == "+celString(r.resource), reqSub+" != ''"))
		default:
			res = append(res, and(groupIs(r.group), "request.resource.resource == "+celString(r.resource), reqSub+" == "+celString(r.sub)))
		}
	}
	var terms []string
	terms = append(terms, or(res))
	switch {
	case len(p.namespaces) > 0:
		terms = append(terms, reqNamespace+" in "+celList(p.namespaces))
	case len(c.o.ProtectedNamespaces) > 0:
		terms = append(terms, "!("+reqNamespace+" in "+celList(sortedCopy(c.o.ProtectedNamespaces))+")")
	}
	// namespaceSelector: the condition cannot see namespace labels; the
	// webhook's namespaceSelector narrows when this is the only policy.
	if len(p.excludeUsers) > 0 {
		terms = append(terms, "!("+reqUser+" in "+celList(p.excludeUsers)+")")
	}
	if len(p.excludeGroups) > 0 {
		terms = append(terms, "!"+reqGroups+".exists(g, g in "+celList(p.excludeGroups)+")")
	}
	return and(terms...)
}

// Request fields read with optional access: the apiserver leaves empty
// ones (namespace, name, subResource, the core group, groups) unset, and
// reading an unset field is an error, which failurePolicy Ignore would
// turn into "skip the webhook".
const (
	reqGroup     = "request.resource.?group.orValue('')"
	reqSub       = "request.?subResource.orValue('')"
	reqNamespace = "request.?namespace.orValue('')"
	reqName      = "request.?name.orValue('')"
	reqUser      = "request.userInfo.?username.orValue('')"
	reqGroups    = "request.userInfo.?groups.orValue([])"
)

func groupIs(g string) string {
	if g == "*" {
		return "true"
	}
	return reqGroup + " == " + celString(g)
}

// pathExprs are CEL expressions over the values a path selects.
type pathExprs struct {
	old, cur       string // comparable: equal in CEL implies equal to the evaluator
	oldSet, curSet string // true whenever the path selects a value
}

// compilePath compiles a path to optional access on oldObject and object.
// Absent and null both read as null, as the evaluator skips nulls.
//
// A path of members, or with one [*] or [k=v] followed by members,
// compiles to the values it selects: a list, filtered by the key and mapped
// to the rest of the path (nulls kept where the evaluator drops them: lists
// that are equal with nulls are equal without). A path with more list
// segments compiles to its member prefix, up to the first list segment: the
// values a path selects are a function of the value there, so an unchanged
// prefix means unchanged values. Not ok when a member name cannot be
// written as a CEL string.
func compilePath(p FieldPath) (pathExprs, bool) {
	prefix, rest := p.segments, []segment(nil)
	for i, seg := range p.segments {
		if seg.kind != segMember {
			prefix, rest = p.segments[:i], p.segments[i:]
			break
		}
	}
	if len(prefix) == 0 {
		return pathExprs{}, false // a path always starts with a member; be safe anyway
	}
	pre, ok := members(prefix)
	if !ok {
		return pathExprs{}, false
	}
	var tail string
	if len(rest) > 0 {
		sel := rest[0]
		after, ok := members(rest[1:])
		if !ok || slices.ContainsFunc(rest[1:], func(s segment) bool { return s.kind != segMember }) {
			tail = "" // more than one list segment: compare the prefix
		} else {
			if sel.kind == segSelect {
				if !utf8.ValidString(sel.name) || !utf8.ValidString(sel.keyValue) {
					return pathExprs{}, false
				}
				tail += ".filter(x, type(x) == map && dyn(x[?" + celString(sel.name) + "].orValue(null)) == " + celString(sel.keyValue) + ")"
			}
			if after != "" {
				tail += ".map(x, x" + after + ".orValue(null))"
			}
			if tail == "" {
				tail = ".map(x, x)" // [*] at the end: the items themselves
			}
		}
	}
	if tail == "" {
		old, cur := "oldObject"+pre+".orValue(null)", "object"+pre+".orValue(null)"
		return pathExprs{old: old, cur: cur, oldSet: old + " != null", curSet: cur + " != null"}, true
	}
	// Anything but a list selects nothing.
	list := func(root string) string {
		v := root + pre + ".orValue([])"
		return "(type(" + v + ") == list ? " + v + " : [])" + tail
	}
	old, cur := list("oldObject"), list("object")
	return pathExprs{old: old, cur: cur, oldSet: old + ".exists(v, v != null)", curSet: cur + ".exists(v, v != null)"}, true
}

// members writes member segments as optional selects.
func members(segs []segment) (string, bool) {
	var b strings.Builder
	for _, seg := range segs {
		if seg.kind != segMember {
			break
		}
		if !utf8.ValidString(seg.name) {
			return "", false
		}
		if isCELIdent(seg.name) {
			b.WriteString(".?" + seg.name)
		} else {
			b.WriteString("[?" + celString(seg.name) + "]")
		}
	}
	return b.String(), true
}

var celReserved = map[string]bool{
	"as": true, "break": true, "const": true, "continue": true, "else": true, "false": true, "for": true,
	"function": true, "if": true, "import": true, "in": true, "let": true, "loop": true, "package": true,
	"namespace": true, "null": true, "return": true, "true": true, "var": true, "void": true, "while": true,
}

func isCELIdent(s string) bool {
	if s == "" || celReserved[s] {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		digit := i > 0 && c >= '0' && c <= '9'
		if !letter && !digit {
			return false
		}
	}
	return true
}

// celString quotes s as a CEL string literal. s must be valid UTF-8.
func celString(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for _, r := range s {
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x80 && unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// celList writes a list of string literals. An entry that is not valid
// UTF-8 cannot be written and is left out, which errs towards calling in
// every list the pre-filter builds: writers, exclusions and exemptions
// shrink, and no namespace that can exist is such a string.
func celList(ss []string) string {
	parts := make([]string, 0, len(ss))
	for _, s := range ss {
		if utf8.ValidString(s) {
			parts = append(parts, celString(s))
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func and(terms ...string) string {
	var keep []string
	for _, t := range terms {
		switch t {
		case "true":
			continue
		case "false":
			return "false"
		}
		keep = append(keep, t)
	}
	switch len(keep) {
	case 0:
		return "true"
	case 1:
		return keep[0]
	}
	return "(" + strings.Join(keep, " && ") + ")"
}

func or(terms []string) string {
	var keep []string
	for _, t := range terms {
		switch t {
		case "false":
			continue
		case "true":
			return "true"
		}
		keep = append(keep, t)
	}
	switch len(keep) {
	case 0:
		return "false"
	case 1:
		return keep[0]
	}
	return "(" + strings.Join(keep, " || ") + ")"
}

// matchesResource reports whether any of the policy's resources match.
func (p *Policy) matchesResource(group, resource, sub string) bool {
	return slices.ContainsFunc(p.resources, func(r resourceMatcher) bool { return r.matches(group, resource, sub) })
}

// checksScale reports whether a rule of the phase is checked on the scale
// subresource of a workload the policy names.
func (p *Policy) checksScale(ph phase) bool {
	return slices.ContainsFunc(p.rules, func(r rule) bool { return r.phase() == ph && r.onScale() })
}
