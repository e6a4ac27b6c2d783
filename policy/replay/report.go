package replay

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// Report is what a replay found: the contract of `webhook replay --format
// json`, documented in docs/replay.md. Times are RFC3339 with
// microseconds, UTC.
type Report struct {
	// Window is the replayed window: the options' bounds, or else the
	// first and last event's time.
	Window Window `json:"window"`
	// Events counts the audit events read, Writes the writes of the window
	// (create, update, patch, delete, deletecollection on ResponseComplete).
	Events uint64 `json:"events"`
	Writes uint64 `json:"writes"`
	// Skipped counts lines that are no audit event.
	Skipped uint64 `json:"skipped"`
	// Policies are the replayed policies' names.
	Policies []string `json:"policies"`
	// Rules counts, per policy and rule, the writes the rule was evaluated
	// for, by outcome.
	Rules []RuleCounts `json:"rules"`
	// TopWriters and TopObjects are who and what would have been refused
	// most, at most Top of each.
	TopWriters []Refusals `json:"top_writers"`
	TopObjects []Refusals `json:"top_objects"`
	// Refused lists every write the webhook would have refused, in the
	// log's order, with the message it would have answered.
	Refused []RefusedWrite `json:"refused"`
}

// Window is the half-open interval [Since, Until).
type Window struct {
	Since string `json:"since"`
	Until string `json:"until"`
}

// RuleCounts are one rule's outcomes. A write breaking a rule counts under
// the rule's action (denied for Deny, warned for Warn, audited for Audit).
type RuleCounts struct {
	Policy string `json:"policy"`
	// Rule is the rule's name in the spec: requireResourceVersion,
	// fieldOwners[0], ...
	Rule string `json:"rule"`
	// Kind is the audit annotation key: stamp-missing, field-owner,
	// immutable-field, delete-precondition.
	Kind        string `json:"kind"`
	Action      string `json:"action"`
	Denied      uint64 `json:"denied"`
	Warned      uint64 `json:"warned"`
	Audited     uint64 `json:"audited"`
	Allowed     uint64 `json:"allowed"`
	Undecidable uint64 `json:"undecidable"`
	// UndecidableReasons counts the undecidable writes by reason.
	UndecidableReasons map[string]uint64 `json:"undecidable_reasons,omitempty"`
}

// Refusals count the refused writes of one writer (User) or one object
// (Resource, Namespace, Name).
type Refusals struct {
	User      string `json:"user,omitempty"`
	Resource  string `json:"resource,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Refused   uint64 `json:"refused"`
	First     string `json:"first"`
	Last      string `json:"last"`
}

// RefusedWrite is one write the webhook would have refused.
type RefusedWrite struct {
	Time      string `json:"time"`
	AuditID   string `json:"audit_id"`
	User      string `json:"user"`
	Verb      string `json:"verb"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Code is the HTTP code the webhook would have answered (422 for a
	// refusal of any rule: admission's answer); Message its message.
	Code    int32  `json:"code"`
	Message string `json:"message"`
	// Rules are the denying rules, as policy/rule.
	Rules []string `json:"rules"`
	// LiveCode is the code the apiserver answered when the write happened.
	LiveCode int `json:"live_code"`
}

// DefaultTop is how many writers and objects the report lists.
const DefaultTop = 10

func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}

type ruleID struct {
	policy string
	kind   policy.RuleKind
	index  int
}

type tally struct {
	n           uint64
	first, last time.Time
}

func (t *tally) add(at time.Time) {
	if t.n == 0 || at.Before(t.first) {
		t.first = at
	}
	if at.After(t.last) {
		t.last = at
	}
	t.n++
}

type objectID struct{ resource, ns, name string }

type accumulator struct {
	names          []string
	events, writes uint64
	skipped        uint64
	first, last    time.Time
	rules          map[ruleID]*RuleCounts
	order          []ruleID
	writers        map[string]*tally
	objects        map[objectID]*tally
	refused        []RefusedWrite
}

func (a *accumulator) init(names []string) {
	a.names = names
	a.rules = map[ruleID]*RuleCounts{}
	a.writers = map[string]*tally{}
	a.objects = map[objectID]*tally{}
}

func (a *accumulator) see(t time.Time) {
	if a.first.IsZero() || t.Before(a.first) {
		a.first = t
	}
	if t.After(a.last) {
		a.last = t
	}
}

func (a *accumulator) counts(r policy.RuleRef) *RuleCounts {
	id := ruleID{r.Policy, r.Rule, r.Index}
	c := a.rules[id]
	if c == nil {
		c = &RuleCounts{Policy: r.Policy, Rule: r.RuleName(), Kind: string(r.Rule), Action: string(r.Action)}
		a.rules[id] = c
		a.order = append(a.order, id)
	}
	return c
}

func (a *accumulator) decided(rules []policy.RuleRef, vs []policy.Violation) {
	for _, r := range rules {
		c := a.counts(r)
		i := slices.IndexFunc(vs, func(v policy.Violation) bool {
			return v.Policy == r.Policy && v.Rule == r.Rule && v.Index == r.Index
		})
		if i < 0 {
			c.Allowed++
			continue
		}
		switch vs[i].Action {
		case v1alpha1.ActionDeny:
			c.Denied++
		case v1alpha1.ActionWarn:
			c.Warned++
		case v1alpha1.ActionAudit:
			c.Audited++
		}
	}
}

func (a *accumulator) undecided(rules []policy.RuleRef, why string) {
	for _, r := range rules {
		c := a.counts(r)
		c.Undecidable++
		if c.UndecidableReasons == nil {
			c.UndecidableReasons = map[string]uint64{}
		}
		c.UndecidableReasons[why]++
	}
}

func (a *accumulator) write(w *Write) {
	a.writes++
	if !w.Refused {
		return
	}
	var rules []string
	for _, v := range w.Violations {
		if v.Action == v1alpha1.ActionDeny {
			rules = append(rules, v.Policy+"/"+v.RuleName())
		}
	}
	a.refused = append(a.refused, RefusedWrite{
		Time: timeText(w.Time), AuditID: w.AuditID, User: w.User, Verb: w.Verb, Resource: w.Resource,
		Namespace: w.Namespace, Name: w.Name, Code: w.RefusedCode, Message: w.Message, Rules: rules, LiveCode: w.Code,
	})
	t := a.writers[w.User]
	if t == nil {
		t = &tally{}
		a.writers[w.User] = t
	}
	t.add(w.Time)
	oid := objectID{w.Resource, w.Namespace, w.Name}
	if t = a.objects[oid]; t == nil {
		t = &tally{}
		a.objects[oid] = t
	}
	t.add(w.Time)
}

func (a *accumulator) report(o Options) *Report {
	r := &Report{
		Window: Window{Since: timeText(cmp.Or(o.Since, a.first)), Until: timeText(cmp.Or(o.Until, a.last))},
		Events: a.events, Writes: a.writes, Skipped: a.skipped, Policies: slices.Clone(a.names),
		Rules: []RuleCounts{}, TopWriters: []Refusals{}, TopObjects: []Refusals{}, Refused: slices.Clone(a.refused),
	}
	if r.Refused == nil {
		r.Refused = []RefusedWrite{}
	}
	ids := slices.Clone(a.order)
	slices.SortFunc(ids, func(x, y ruleID) int {
		return cmp.Or(strings.Compare(x.policy, y.policy), strings.Compare(string(x.kind), string(y.kind)), cmp.Compare(x.index, y.index))
	})
	for _, id := range ids {
		r.Rules = append(r.Rules, *a.rules[id])
	}
	for u, t := range a.writers {
		r.TopWriters = append(r.TopWriters, Refusals{User: u, Refused: t.n, First: timeText(t.first), Last: timeText(t.last)})
	}
	for id, t := range a.objects {
		r.TopObjects = append(r.TopObjects, Refusals{Resource: id.resource, Namespace: id.ns, Name: id.name, Refused: t.n, First: timeText(t.first), Last: timeText(t.last)})
	}
	byCount := func(x, y Refusals) int {
		return cmp.Or(cmp.Compare(y.Refused, x.Refused), strings.Compare(x.User, y.User), strings.Compare(x.Resource, y.Resource),
			strings.Compare(x.Namespace, y.Namespace), strings.Compare(x.Name, y.Name))
	}
	slices.SortFunc(r.TopWriters, byCount)
	slices.SortFunc(r.TopObjects, byCount)
	return r
}

// Trim keeps the top n writers and objects.
func (r *Report) Trim(top int) {
	if top > 0 {
		r.TopWriters = r.TopWriters[:min(top, len(r.TopWriters))]
		r.TopObjects = r.TopObjects[:min(top, len(r.TopObjects))]
	}
}

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for a terminal: the rules' counts, the top
// writers and objects, and the first refused writes' messages (all of them
// are in --format json).
func WriteTable(w io.Writer, r *Report, refusedShown int) error {
	p := &printer{w: w}
	p.f("replay of %d audit events, %d writes, %s to %s; policies: %s\n", r.Events, r.Writes, r.Window.Since, r.Window.Until, strings.Join(r.Policies, ", "))
	if r.Skipped > 0 {
		p.f("%d lines were no audit event and were skipped\n", r.Skipped)
	}
	p.f("\nper policy and rule (writes the rule was evaluated for)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tRULE\tACTION\tDENIED\tWARNED\tAUDITED\tALLOWED\tUNDECIDABLE")
	for _, c := range r.Rules {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", c.Policy, c.Rule, c.Action, c.Denied, c.Warned, c.Audited, c.Allowed, c.Undecidable)
	}
	if len(r.Rules) == 0 {
		fmt.Fprintln(tw, "(no write of the window is guarded by these policies)")
	}
	p.err = tw.Flush()
	for _, c := range r.Rules {
		reasons := make([]string, 0, len(c.UndecidableReasons))
		for why := range c.UndecidableReasons {
			reasons = append(reasons, why)
		}
		slices.Sort(reasons)
		for _, why := range reasons {
			p.f("  undecidable %s/%s: %d × %s\n", c.Policy, c.Rule, c.UndecidableReasons[why], why)
		}
	}
	p.f("\nwho would be refused\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WRITER\tREFUSED\tFIRST\tLAST")
	for _, t := range r.TopWriters {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", t.User, t.Refused, t.First, t.Last)
	}
	if len(r.TopWriters) == 0 {
		fmt.Fprintln(tw, "(nobody)")
	}
	if err := tw.Flush(); p.err == nil {
		p.err = err
	}
	p.f("\nwhat would be refused\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tNAMESPACE\tNAME\tREFUSED\tFIRST\tLAST")
	for _, t := range r.TopObjects {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", t.Resource, t.Namespace, t.Name, t.Refused, t.First, t.Last)
	}
	if len(r.TopObjects) == 0 {
		fmt.Fprintln(tw, "(nothing)")
	}
	if err := tw.Flush(); p.err == nil {
		p.err = err
	}
	if len(r.Refused) > 0 {
		shown := min(refusedShown, len(r.Refused))
		p.f("\nrefused writes (%d of %d; --format json lists all)\n", shown, len(r.Refused))
		for _, rw := range r.Refused[:shown] {
			p.f("%s  %s %s %s/%s by %s: %d %s\n", rw.Time, rw.Verb, rw.Resource, rw.Namespace, rw.Name, rw.User, rw.Code, rw.Message)
		}
	}
	return p.err
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}
