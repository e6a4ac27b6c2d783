// Package replay answers "what would these ConcurrencyPolicies have
// refused?" from the apiserver's audit log, with the code admission runs:
// each write of the log becomes the policy.Request the webhook would have
// been sent, evaluated by policy.Set.CheckStamp and CheckFields, and
// answered by admission.StampVerdict and FieldsVerdict.
//
// Each object's state is rebuilt from the log (the responseObject of its
// writes and reads), so field owners and immutable fields compare with the
// object admission would have seen as oldObject. A write whose old object
// or body the log lacks is undecidable, with the reason; it is never
// guessed.
package replay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// Options configure a Replayer.
type Options struct {
	// Policies are evaluated. Required.
	Policies *policy.Set
	// ProtectedNamespaces are the webhook's (its --namespace besides
	// policy.DefaultProtectedNamespaces). Defaults to those defaults.
	ProtectedNamespaces []string
	// BreakGlassGroup members bypass every policy, as the webhook's
	// --break-glass-group; empty: webhookconfig.DefaultBreakGlassGroup, "-":
	// none.
	BreakGlassGroup string
	// Since and Until bound the writes counted, [Since, Until); zero: no
	// bound. Events before Since still rebuild the objects' states.
	Since, Until time.Time
	// Namespaces, when not nil, are the cluster's namespace labels; else
	// the labels of the namespaces the log holds answer namespaceSelector.
	Namespaces map[string]labels.Set
	// OnWrite, when set, sees every write of the window as replayed.
	OnWrite func(*Write)
}

// Write is one write of the log as replayed.
type Write struct {
	AuditID string
	Time    time.Time
	User    string
	Verb    string
	// Resource is resource.group/subresource.
	Resource  string
	Namespace string
	Name      string
	// Code is the HTTP code the apiserver answered.
	Code int
	// Violations are what CheckStamp and CheckFields found, in that order.
	Violations []policy.Violation
	// Undecidable are the rules the log cannot decide, with Reason.
	Undecidable []policy.RuleRef
	Reason      string
	// Refused is set when the webhook would have refused the write; Message
	// is what it would have answered, RefusedCode the HTTP code.
	Refused     bool
	RefusedCode int32
	Message     string
	// NotSent is set when a rule was broken but the apiserver would not
	// have sent the write to the webhook (its configurations' rules,
	// namespaceSelector or matchConditions: a Helm release record, an
	// exempt namespace, the break-glass group).
	NotSent bool
	// Live are the decisions the webhook that served the write recorded in
	// its audit annotations (policy, rule, action).
	Live []LiveDecision
}

// LiveDecision is one entry of the webhook's audit annotations.
type LiveDecision struct{ Policy, Rule, Action string }

// Replayer replays audit events in the order of the log.
type Replayer struct {
	o      Options
	env    *policy.Environment
	ns     namespaceLabels
	states map[objectKey]*objectState
	route  *router
	acc    accumulator
	ev     event
	w      Write
}

// New makes a Replayer.
func New(o Options) (*Replayer, error) {
	if o.Policies == nil || o.Policies.Len() == 0 {
		return nil, fmt.Errorf("no policies to replay")
	}
	env := &policy.Environment{ProtectedNamespaces: slices.Clone(policy.DefaultProtectedNamespaces)}
	for _, ns := range o.ProtectedNamespaces {
		if !slices.Contains(env.ProtectedNamespaces, ns) {
			env.ProtectedNamespaces = append(env.ProtectedNamespaces, ns)
		}
	}
	switch o.BreakGlassGroup {
	case "":
		env.BreakGlassGroup = webhookconfig.DefaultBreakGlassGroup
	case "-":
	default:
		env.BreakGlassGroup = o.BreakGlassGroup
	}
	route, err := newRouter(webhookconfig.ConfigOptions{
		URL: "https://replay.invalid", Policies: o.Policies, ProtectedNamespaces: env.ProtectedNamespaces,
		ExcludedNamespaces: env.ProtectedNamespaces, BreakGlassGroup: cmp.Or(env.BreakGlassGroup, "-"),
	})
	if err != nil {
		return nil, err
	}
	r := &Replayer{o: o, env: env, states: map[objectKey]*objectState{}, route: route}
	r.ns.cluster = o.Namespaces
	env.Namespaces = &r.ns
	r.acc.init(o.Policies.Names())
	return r, nil
}

// reset forgets every event replayed (for the fuzz target).
func (r *Replayer) reset() {
	r.states = map[objectKey]*objectState{}
	r.ns.seen = nil
	names := r.acc.names
	r.acc = accumulator{}
	r.acc.init(names)
}

// Event replays one line of an audit log. A line that is no audit event is
// an error (the caller counts it and goes on).
func (r *Replayer) Event(line []byte) error {
	ev := &r.ev
	if err := parseEvent(line, ev); err != nil {
		return err
	}
	r.acc.events++
	if !ev.Counted() {
		return nil
	}
	inWindow := (r.o.Since.IsZero() || !ev.time.Before(r.o.Since)) && (r.o.Until.IsZero() || ev.time.Before(r.o.Until))
	if inWindow {
		r.acc.see(ev.time)
		if audit.IsWriteVerb(ev.Verb) {
			r.write(ev)
		}
	}
	r.observe(ev)
	return nil
}

// Report is what the replay found so far.
func (r *Replayer) Report() *Report { return r.acc.report(r.o) }

// observe updates the objects' states with what ev says about them.
func (r *Replayer) observe(ev *event) {
	if ev.Name == "" || !ev.Success() {
		return
	}
	key := stateKey(ev)
	switch ev.Verb {
	case "get", "create", "update", "patch":
	case "delete":
		if ev.Subresource == "" {
			delete(r.states, key)
			delete(r.states, objectKey{key.group, key.resource, "scale", key.ns, key.name})
		}
		return
	default:
		return
	}
	st := r.states[key]
	if st == nil {
		st = &objectState{}
		r.states[key] = st
	}
	if !ev.HasResponse() || ev.respObj == nil || isStatus(ev.respObj) {
		if ev.Verb != "get" {
			// Changed, to something the log does not hold.
			st.versions = st.versions[:0]
		}
		return
	}
	rv, ok := objectRV(ev.respObj)
	if !ok {
		return
	}
	st.add(rv, ev.respObj)
	if ev.APIGroup == "" && ev.Resource == "namespaces" && ev.Subresource == "" {
		r.ns.observe(ev.Name, ev.respObj)
	}
	if ev.Verb == "get" {
		return
	}
	// A write changes the object and its scale together: the other one is
	// at rv now too, with what it holds unknown.
	switch key.sub {
	case "":
		if other := r.states[objectKey{key.group, key.resource, "scale", key.ns, key.name}]; other != nil {
			other.add(rv, nil)
		}
	case "scale":
		if other := r.states[objectKey{key.group, key.resource, "", key.ns, key.name}]; other != nil {
			other.add(rv, nil)
		}
	}
}

// write replays one write: the stamp phase, then, unless it refused, the
// fields phase, each only when the apiserver's answer says admission got
// that far.
func (r *Replayer) write(ev *event) {
	w := &r.w
	*w = Write{
		AuditID: ev.AuditID, Time: ev.time, User: ev.user.Name, Verb: ev.Verb,
		Namespace: ev.Namespace, Name: ev.Name, Code: int(ev.Code),
		Violations: w.Violations[:0], Undecidable: w.Undecidable[:0], Live: w.Live[:0],
	}
	for _, e := range ev.live {
		w.Live = append(w.Live, LiveDecision{e.Policy, e.Rule, e.Action})
	}
	req := policy.Request{
		Group: ev.APIGroup, Resource: ev.Resource, SubResource: ev.Subresource, Namespace: ev.Namespace, Name: ev.Name, User: ev.user,
	}
	w.Resource = req.ResourceName()
	switch ev.Verb {
	case "create":
		req.Operation = policy.Create
	case "update", "patch":
		req.Operation = policy.Update
	default:
		req.Operation = policy.Delete
		if ev.Verb == "deletecollection" {
			req.Name = "" // its items reach admission without a name
		}
	}
	reached := admissionReached(ev)
	req.DryRun = ev.DryRun
	if req.Operation != policy.Delete && ev.FieldManager != "" {
		req.Options = rawjson.AppendString([]byte(`{"fieldManager":`), ev.FieldManager)
		req.Options = append(req.Options, '}')
	}

	stampDenied := false
	if req.Operation == policy.Update && reached {
		if rules := r.o.Policies.StampRules(&req, r.env); len(rules) > 0 {
			sreq := req
			obj, why := r.stampObject(ev)
			if why != "" {
				r.undecidable(w, rules, why)
			} else {
				sreq.Object = obj
				r.decide(w, rules, &sreq, true)
				stampDenied = w.Refused
			}
		}
	}
	if reached && !stampDenied && fieldsReached(ev) {
		if rules := r.o.Policies.FieldRules(&req, r.env); len(rules) > 0 {
			freq := req
			if why := r.fieldObjects(ev, &freq); why != "" {
				r.undecidable(w, rules, why)
			} else {
				r.decide(w, rules, &freq, false)
			}
		}
	}
	r.acc.write(w)
	if r.o.OnWrite != nil {
		r.o.OnWrite(w)
	}
}

// admissionReached reports whether admission saw the request: not when
// authentication, authorization, flow control or decoding refused it, or
// the object was not found.
func admissionReached(ev *event) bool {
	if ev.authzForbid {
		return false
	}
	switch ev.Code {
	case 400, 401, 404, 405, 406, 413, 415, 429:
		return false
	}
	return ev.Code != 0
}

// fieldsReached reports whether the validating phase saw the request: the
// apiserver's own checks (a version conflict, a validation error) come
// before it and answer 409 and 422. A 422 of stampguard's fields webhook
// itself is a refusal of that phase.
func fieldsReached(ev *event) bool {
	return ev.Code != 409 && (ev.Code != 422 || ev.fieldsRefused)
}

func (r *Replayer) decide(w *Write, rules []policy.RuleRef, req *policy.Request, stamp bool) {
	var d policy.Decision
	var err error
	if stamp {
		d, err = r.o.Policies.CheckStamp(req, r.env)
	} else {
		d, err = r.o.Policies.CheckFields(req, r.env)
	}
	if err != nil {
		// The webhook refuses what it cannot read; the log's copy of the
		// object may be cut, so replay says so rather than refuse.
		r.undecidable(w, rules, "the webhook could not read the objects: "+err.Error())
		return
	}
	if len(d.Violations) > 0 {
		// Only a violation needs the (slower) routing: the pre-filter's
		// condition is true for every one the webhook would find.
		h := &r.route.fields
		if stamp {
			h = &r.route.stamp
		}
		ns, _ := r.ns.Labels(req.Namespace)
		called, err := h.calls(context.Background(), req, ns)
		if err != nil {
			r.undecidable(w, rules, "the webhook configuration's matchConditions fail on this write: "+err.Error())
			return
		}
		if !called {
			w.NotSent = true
			d = policy.Decision{}
		}
	}
	w.Violations = append(w.Violations, d.Violations...)
	v := admission.FieldsVerdict(d)
	if stamp {
		v = admission.StampVerdict(d)
	}
	if !v.Allowed {
		w.Refused, w.RefusedCode, w.Message = true, v.Code, v.Message
	}
	r.acc.decided(rules, d.Violations)
}

func (r *Replayer) undecidable(w *Write, rules []policy.RuleRef, why string) {
	w.Undecidable = append(w.Undecidable, rules...)
	if w.Reason == "" {
		w.Reason = why
	}
	r.acc.undecided(rules, why)
}

// stampObject is what the stamp phase reads of an update's object: its
// metadata.resourceVersion.
func (r *Replayer) stampObject(ev *event) ([]byte, string) {
	if ev.Verb == "update" {
		// A PUT's body is the object; the apiserver copies its stamp into
		// objectRef, at every level.
		if ev.reqObj != nil && rawjson.Kind(ev.reqObj) == '{' {
			return ev.reqObj, ""
		}
		if ev.Level == "Metadata" {
			return stampOnly(ev.Stamp), ""
		}
		return nil, "the update's body is not in the log"
	}
	// A patch is applied to the stored object, which carries its stamp,
	// unless the patch itself sets metadata.resourceVersion.
	if ev.reqObj == nil {
		return nil, "the patch is not in the log (level " + ev.Level + ")"
	}
	switch rawjson.Kind(ev.reqObj) {
	case '{':
		if md, ok, err := rawjson.Member(ev.reqObj, "metadata"); err == nil && ok && rawjson.Kind(md) == '{' {
			if v, ok, err := rawjson.Member(md, "resourceVersion"); err == nil && ok {
				if rawjson.IsNull(v) {
					return stampOnly(""), ""
				}
				s, err := rawjson.String(v)
				if err != nil {
					return nil, "the patch sets metadata.resourceVersion to a non-string"
				}
				return stampOnly(s), ""
			}
		}
		return stampOnly("stored"), ""
	case '[':
		if strings.Contains(string(ev.reqObj), "/metadata/resourceVersion") {
			return nil, "a JSON patch of metadata.resourceVersion"
		}
		return stampOnly("stored"), ""
	}
	return nil, "the patch is not JSON in the log"
}

func stampOnly(rv string) []byte {
	b := []byte(`{"metadata":{"resourceVersion":`)
	b = rawjson.AppendString(b, rv)
	return append(b, "}}"...)
}

// fieldObjects fills the objects of the validating phase: object (the
// write's result) and, for an update, oldObject (the version it replaced);
// for a delete the DeleteOptions. It returns why it cannot.
func (r *Replayer) fieldObjects(ev *event, req *policy.Request) string {
	if req.Operation == policy.Delete {
		switch {
		case ev.HasRequest():
			req.Options = ev.reqObj // nil: no body, no preconditions
			// oldObject only for the configurations' matchConditions.
			if st := r.states[stateKey(ev)]; st != nil {
				if v, ok := st.latest(); ok {
					req.OldObject = v.obj
				}
			}
			return ""
		default:
			return "the delete's options are not in the log (level " + ev.Level + ")"
		}
	}
	// object: what was stored, or for a refused write what was sent.
	switch {
	case ev.Success() && ev.HasResponse() && ev.respObj != nil && !isStatus(ev.respObj):
		req.Object = ev.respObj
	case ev.Verb == "patch":
		return "the patch was refused before it was applied: the patched object is not in the log"
	case ev.HasRequest() && ev.reqObj != nil && rawjson.Kind(ev.reqObj) == '{':
		req.Object = ev.reqObj
	default:
		return "the written object is not in the log (level " + ev.Level + ")"
	}
	if req.Operation == policy.Create {
		return ""
	}
	old, why := r.oldObject(ev, req.Object)
	req.OldObject = old
	return why
}

// oldObject is the version of the object the update replaced.
func (r *Replayer) oldObject(ev *event, written []byte) ([]byte, string) {
	key := stateKey(ev)
	stamp, stamped := parseRV(ev.Stamp)
	if ev.Verb == "update" && !stamped {
		stamp, stamped = objectRV(ev.reqObj)
	}
	stamped = stamped && ev.Verb == "update"
	writtenRV, hasWritten := objectRV(written)
	find := func(st *objectState) (version, bool) {
		switch {
		case st == nil:
			return version{}, false
		case stamped:
			return st.at(stamp)
		case ev.Success() && hasWritten:
			if v, ok := st.at(writtenRV); ok && v.obj != nil {
				return v, true // a write that changed nothing keeps its version
			}
			return st.before(writtenRV)
		case ev.Success():
			return version{}, false
		}
		return st.latest()
	}
	v, ok := find(r.states[key])
	if (!ok || v.obj == nil) && key.sub == "scale" {
		// A Scale is its workload's replicas: the workload at that version
		// says what the Scale held.
		if bv, found := find(r.states[objectKey{key.group, key.resource, "", key.ns, key.name}]); found && bv.obj != nil && (!ok || bv.rv == v.rv) {
			return scaleOf(bv.obj), ""
		}
	}
	if !ok || v.obj == nil {
		if stamped {
			return nil, fmt.Sprintf("the log does not hold the object at resourceVersion %d, which the update replaced", stamp)
		}
		return nil, "the log does not hold the object this write replaced (it starts later, or the object's writes are logged below RequestResponse)"
	}
	return v.obj, ""
}

// scaleOf is the Scale of a workload object: its metadata's identity and
// its spec.replicas, which is all a Scale's rules can name of it.
func scaleOf(obj []byte) []byte {
	b := []byte(`{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{`)
	sep := false
	if md, ok, err := rawjson.Member(obj, "metadata"); err == nil && ok && rawjson.Kind(md) == '{' {
		_ = rawjson.ObjectEach(md, func(k, v []byte) bool {
			for _, name := range []string{"name", "namespace", "uid", "resourceVersion", "creationTimestamp"} {
				if rawjson.KeyIs(k, name) {
					if sep {
						b = append(b, ',')
					}
					b = rawjson.AppendString(b, name)
					b = append(b, ':')
					b = append(b, rawjson.Trim(v)...)
					sep = true
				}
			}
			return true
		})
	}
	b = append(b, `},"spec":{`...)
	if spec, ok, err := rawjson.Member(obj, "spec"); err == nil && ok && rawjson.Kind(spec) == '{' {
		if n, ok, err := rawjson.Member(spec, "replicas"); err == nil && ok {
			b = append(b, `"replicas":`...)
			b = append(b, rawjson.Trim(n)...)
		}
	}
	return append(b, "}}"...)
}
