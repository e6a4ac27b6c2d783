package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The apiserver's own match-condition code: the compiler the webhook
// plugin builds (generic/webhook.go) and the matcher it runs before a call.
var celCompiler = plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))

// apiserverMatcher compiles conditions the way a webhook accessor does.
func apiserverMatcher(conditions ...string) matchconditions.Matcher {
	exprs := make([]plugincel.ExpressionAccessor, len(conditions))
	for i, c := range conditions {
		exprs[i] = &matchconditions.MatchCondition{Name: fmt.Sprintf("c%d", i), Expression: c}
	}
	// With Fail an evaluation error comes back as an error (Ignore would
	// silently skip the call); the property fails on either.
	fail := admissionregistrationv1.Fail
	return matchconditions.NewMatcher(celCompiler.CompileCondition(exprs,
		plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: true},
		environment.StoredExpressions), &fail, "webhook", "validating", "test")
}

var prefilterResources = []schema.GroupResource{
	{Group: "", Resource: "configmaps"}, {Group: "", Resource: "secrets"},
	{Group: "apps", Resource: "deployments"}, {Group: "apps", Resource: "statefulsets"},
}

const breakGlass = "stampguard:break-glass"

var testEnv = &policy.Environment{
	// The webhook protects its own namespace too; the pre-filter, given
	// the defaults only, calls for it and lets the webhook skip it.
	ProtectedNamespaces: append(slices.Clone(policy.DefaultProtectedNamespaces), "stampguard-system"),
	BreakGlassGroup:     breakGlass,
	Namespaces:          nsLabels{"a": {"env": "prod"}, "b": {}, "c": {"env": "prod", "tier": "1"}, "kube-system": {}},
}

type nsLabels map[string]labels.Set

func (n nsLabels) Labels(ns string) (labels.Set, bool) { l, ok := n[ns]; return l, ok }

// gen draws policies and requests from a small vocabulary, so that rules,
// writers, namespaces and values collide often.
type gen struct{ r *rand.Rand }

func (g gen) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }
func (g gen) some(xs ...string) []string {
	var out []string
	for _, x := range xs {
		if g.r.IntN(3) == 0 {
			out = append(out, x)
		}
	}
	return out
}

var paths = []string{
	"spec.replicas", `data["owned"]`, "data.x", `metadata.labels["team"]`, `metadata.labels["a.b/c"]`,
	`metadata.annotations["it's"]`, `metadata.annotations["é"]`, "spec.in", "spec.items[*]",
	"spec.template.spec.containers[*].image", "spec.template.spec.containers[name=app].image",
}

var users = []string{"alice", "bob", "system:serviceaccount:kube-system:hpa", "system:serviceaccount:ci:deployer",
	"system:serviceaccount:kube-system:namespace-controller"}
var groups = []string{"devs", "ops", "system:serviceaccounts", breakGlass}

func (g gen) action() v1alpha1.Action {
	return v1alpha1.Action(g.pick("", "", "Deny", "Warn", "Audit"))
}

func (g gen) policy(i int) *v1alpha1.ConcurrencyPolicy {
	p := &v1alpha1.ConcurrencyPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)}}
	s := &p.Spec
	s.Action = g.action()
	for range 1 + g.r.IntN(2) {
		s.Match.Resources = append(s.Match.Resources, [...]v1alpha1.ResourceMatch{
			{Resource: "configmaps"}, {Group: "apps", Resource: "deployments"}, {Group: "*", Resource: "*"},
			{Group: "apps", Resource: "*"}, {Group: "apps", Resource: "deployments/scale"}, {Resource: "secrets"},
			{Group: "apps", Resource: "statefulsets"},
		}[g.r.IntN(7)])
	}
	if g.r.IntN(2) == 0 {
		s.Match.Namespaces = g.some("a", "b", "c", "kube-system")
	}
	if g.r.IntN(5) == 0 {
		s.Match.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
	}
	s.Match.ExcludeUsers = g.some("alice", "system:serviceaccount:ci:deployer")
	s.Match.ExcludeGroups = g.some("ops")
	s.RequireResourceVersion = g.r.IntN(3) == 0
	if g.r.IntN(3) == 0 {
		s.RequireDeletePreconditions = v1alpha1.DeletePrecondition(g.pick("uid", "resourceVersion"))
		s.DeletePreconditionsAction = g.action()
		if g.r.IntN(2) == 0 {
			ex := g.some("alice", "bob")
			s.DeletePreconditionExemptUsers = &ex
		}
		if g.r.IntN(2) == 0 {
			b := g.r.IntN(2) == 0
			s.DeleteCollectionExempt = &b
		}
	}
	for range g.r.IntN(4) {
		w := v1alpha1.Writers{Users: g.some("alice", "bob"), Groups: g.some("devs", "system:serviceaccounts"),
			ServiceAccounts: g.some("kube-system/hpa", "ci/deployer"), FieldManagers: g.some("kubectl", "helm")}
		if len(w.Users)+len(w.Groups)+len(w.ServiceAccounts)+len(w.FieldManagers) == 0 {
			w.Users = []string{"bob"}
		}
		s.FieldOwners = append(s.FieldOwners, v1alpha1.FieldOwner{
			Path: g.pick(paths...), Writers: w, OnCreate: g.r.IntN(3) == 0, Action: g.action(),
		})
	}
	for range g.r.IntN(3) {
		s.ImmutableFields = append(s.ImmutableFields, v1alpha1.ImmutableField{
			Path: g.pick(paths...), Mode: v1alpha1.ImmutableMode(g.pick("", "Always", "OnceSet")), Action: g.action(),
		})
	}
	if !s.RequireResourceVersion && s.RequireDeletePreconditions == "" && len(s.FieldOwners)+len(s.ImmutableFields) == 0 {
		s.RequireResourceVersion = true
	}
	return p
}

// value draws a JSON value for a guarded field: absent (nil), null, or a
// string, number or structure, with look-alikes (1 and 1.0, "1" and 1).
func (g gen) value() any {
	switch g.r.IntN(12) {
	case 0, 1, 2:
		return nil
	case 3:
		return json.RawMessage("null")
	case 4:
		return int64(1)
	case 5:
		return 1.0
	case 6:
		return int64(2)
	case 7:
		return "1"
	case 8:
		return "x"
	case 9:
		return map[string]any{"k": "v"}
	case 10:
		return []any{"a", int64(1)}
	}
	return ""
}

// object builds a ConfigMap- or Deployment-shaped document.
func (g gen) object(kind string) map[string]any {
	set := func(m map[string]any, k string, v any) {
		if v != nil {
			m[k] = v
		}
	}
	meta := map[string]any{"name": "o", "resourceVersion": g.pick("", "7", "8")}
	lbls := map[string]any{}
	set(lbls, "team", g.value())
	set(lbls, "a.b/c", g.value())
	if len(lbls) > 0 || g.r.IntN(2) == 0 {
		meta["labels"] = lbls
	}
	ann := map[string]any{}
	set(ann, "it's", g.value())
	set(ann, "é", g.value())
	if len(ann) > 0 {
		meta["annotations"] = ann
	}
	obj := map[string]any{"metadata": meta}
	switch kind {
	case "Scale":
		obj["apiVersion"], obj["kind"] = "autoscaling/v1", "Scale"
		spec := map[string]any{}
		set(spec, "replicas", g.value())
		obj["spec"] = spec
	case "ConfigMap":
		obj["apiVersion"], obj["kind"] = "v1", "ConfigMap"
		data := map[string]any{}
		set(data, "owned", g.value())
		set(data, "x", g.value())
		set(data, "free", g.pick("0", "1"))
		obj["data"] = data
	default:
		obj["apiVersion"], obj["kind"] = "apps/v1", kind
		spec := map[string]any{}
		set(spec, "replicas", g.value())
		set(spec, "in", g.value())
		set(spec, "items", g.value())
		var containers []any
		for _, name := range g.some("app", "side") {
			c := map[string]any{"name": name}
			set(c, "image", g.value())
			containers = append(containers, c)
		}
		// Items a select must pass over: not an object, a key that is not
		// a string, null.
		switch g.r.IntN(6) {
		case 0:
			containers = append(containers, "junk")
		case 1:
			containers = append(containers, map[string]any{"name": int64(1), "image": "x"})
		case 2:
			containers = append(containers, nil)
		}
		if containers != nil {
			spec["template"] = map[string]any{"spec": map[string]any{"containers": containers}}
		}
		obj["spec"] = spec
	}
	return obj
}

// mutate returns a copy of obj with, sometimes, a few guarded values redrawn
// and often only the free ones: most writes touch no guarded field.
func (g gen) mutate(obj map[string]any, kind string) map[string]any {
	if g.r.IntN(3) != 0 {
		out := deepCopy(obj)
		if d, ok := out["data"].(map[string]any); ok {
			d["free"] = g.pick("2", "3")
		}
		if m, ok := out["metadata"].(map[string]any); ok && g.r.IntN(2) == 0 {
			m["resourceVersion"] = g.pick("", "8")
		}
		// A change beside the guarded values inside a guarded list.
		if spec, ok := out["spec"].(map[string]any); ok && g.r.IntN(2) == 0 {
			if tpl, ok := spec["template"].(map[string]any); ok {
				for _, c := range tpl["spec"].(map[string]any)["containers"].([]any) {
					if c, ok := c.(map[string]any); ok {
						c["env"] = g.pick("a", "b")
					}
				}
			}
		}
		return out
	}
	return g.object(kind)
}

func deepCopy(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

type sample struct {
	req   policy.Request
	attrs *admission.VersionedAttributes
	nsLbl labels.Set
}

func (g gen) request() sample {
	res := prefilterResources[g.r.IntN(len(prefilterResources))]
	kind := map[string]string{"configmaps": "ConfigMap", "secrets": "ConfigMap", "deployments": "Deployment", "statefulsets": "StatefulSet"}[res.Resource]
	sub := ""
	if res.Group == "apps" && g.r.IntN(3) == 0 {
		sub, kind = "scale", "Scale"
	}
	op := policy.Operation(g.pick("UPDATE", "UPDATE", "UPDATE", "CREATE", "DELETE"))
	if sub != "" {
		op = policy.Update
	}
	ns := g.pick("a", "b", "c", "d", "kube-system", "stampguard-system", "")
	name := "o"
	// The apiserver adds system:authenticated to every authenticated user;
	// CEL reads an empty groups list as a missing key.
	u := policy.UserInfo{Name: g.pick(users...), Groups: append(g.some(groups...), "system:authenticated")}
	var obj, old map[string]any
	var opts runtime.Object
	switch op {
	case policy.Create:
		obj = g.object(kind)
		opts = &metav1.CreateOptions{FieldManager: g.pick("", "kubectl", "helm")}
	case policy.Update:
		old = g.object(kind)
		obj = g.mutate(old, kind)
		opts = &metav1.UpdateOptions{FieldManager: g.pick("", "kubectl", "helm")}
	case policy.Delete:
		old = g.object(kind)
		do := &metav1.DeleteOptions{}
		if g.r.IntN(2) == 0 {
			do.Preconditions = &metav1.Preconditions{}
			if g.r.IntN(2) == 0 {
				uid := types.UID(g.pick("", "u1"))
				do.Preconditions.UID = &uid
			}
			if g.r.IntN(2) == 0 {
				rv := g.pick("", "7")
				do.Preconditions.ResourceVersion = &rv
			}
		}
		opts = do
		if g.r.IntN(4) == 0 {
			name = "" // an item of a deletecollection
		}
	}
	s := sample{req: policy.Request{
		Operation: op, Group: res.Group, Resource: res.Resource, SubResource: sub, Namespace: ns, Name: name, User: u,
	}}
	var objRT, oldRT runtime.Object
	if obj != nil {
		s.req.Object = mustJSON(obj)
		objRT = &unstructured.Unstructured{Object: obj}
	}
	if old != nil {
		s.req.OldObject = mustJSON(old)
		oldRT = &unstructured.Unstructured{Object: old}
	}
	s.req.Options = mustJSON(opts)
	gvk := schema.GroupVersionKind{Group: res.Group, Version: "v1", Kind: kind}
	if sub == "scale" {
		gvk = schema.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "Scale"}
	}
	a := admission.NewAttributesRecord(objRT, oldRT, gvk, ns, name,
		schema.GroupVersionResource{Group: res.Group, Version: "v1", Resource: res.Resource}, sub,
		admission.Operation(op), opts, false, &user.DefaultInfo{Name: u.Name, Groups: u.Groups})
	s.attrs = &admission.VersionedAttributes{Attributes: a, VersionedKind: gvk,
		VersionedObject: admission.NewLazyObject(objRT), VersionedOldObject: admission.NewLazyObject(oldRT)}
	if l, ok := testEnv.Namespaces.Labels(ns); ok {
		s.nsLbl = labels.Merge(l, labels.Set{"kubernetes.io/metadata.name": ns})
	} else {
		s.nsLbl = labels.Set{"kubernetes.io/metadata.name": ns}
	}
	return s
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// calls reports whether the apiserver would call the webhook that f
// describes: rules, namespaceSelector, then the condition.
func calls(t testing.TB, f policy.WebhookFilter, m matchconditions.Matcher, s sample) (bool, error) {
	routed := false
	for _, gr := range f.Resources {
		res, sub, _ := strings.Cut(gr.Resource, "/")
		if gr.Group == s.req.Group && res == s.req.Resource && sub == s.req.SubResource {
			routed = true
		}
	}
	if !routed || !slices.Contains(f.Operations, s.req.Operation) {
		return false, nil
	}
	if s.req.Namespace != "" {
		if f.Namespaces != nil && !slices.Contains(f.Namespaces, s.req.Namespace) {
			return false, nil
		}
		if slices.Contains(f.ExcludedNamespaces, s.req.Namespace) {
			return false, nil
		}
		if f.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(f.NamespaceSelector)
			if err != nil {
				t.Fatalf("namespaceSelector %v: %v", f.NamespaceSelector, err)
			}
			if !sel.Matches(s.nsLbl) {
				return false, nil
			}
		}
	}
	r := m.Match(context.Background(), s.attrs, nil, nil)
	return r.Matches, r.Error
}

// stamplessCondition is policy.StamplessCondition spelled out: the stamp
// webhook's matchCondition, which the configurations give the apiserver as
// webhookconfig.StamplessCondition.
const stamplessCondition = `!has(object.metadata.resourceVersion) || object.metadata.resourceVersion == ''`

type propertyStats struct {
	violations, clean, cleanSkipped, stampViolations int
}

// checkPrefilter draws one policy set and many requests from seed, and
// fails when the Go evaluator finds a violation the compiled filter would
// not send to the webhook.
func checkPrefilter(t testing.TB, seed uint64, requests int, st *propertyStats) {
	g := gen{r: rand.New(rand.NewPCG(seed, seed^0x5eed))}
	var ps []*policy.Policy
	var specs []*v1alpha1.ConcurrencyPolicy
	for i := range 1 + g.r.IntN(4) {
		spec := g.policy(i)
		p, err := policy.Compile(spec)
		if err != nil {
			t.Fatalf("seed %d: generated policy does not compile: %v", seed, err)
		}
		ps, specs = append(ps, p), append(specs, spec)
	}
	set := policy.NewSet(ps...)
	// Some seeds squeeze the condition into the coarse and the "true"
	// fallbacks, which must be safe too.
	maxBytes := [...]int{0, 0, 0, 0, 600, 40}[seed%6]
	pf := set.Prefilter(policy.PrefilterOptions{Resources: prefilterResources, MaxConditionBytes: maxBytes})
	if maxBytes == 0 && !pf.Fields.Exact {
		t.Fatalf("seed %d: a small set fell back: %d bytes", seed, len(pf.Fields.Condition))
	}
	notBreakGlass := `!('` + breakGlass + `' in request.userInfo.groups)`
	fields := apiserverMatcher(pf.Fields.Condition, notBreakGlass)
	stamp := apiserverMatcher(stamplessCondition, pf.Stamp.Condition, notBreakGlass)
	for range requests {
		s := g.request()
		d, err := set.CheckFields(&s.req, testEnv)
		if err != nil {
			t.Fatalf("seed %d: evaluate: %v", seed, err)
		}
		called, cerr := calls(t, pf.Fields, fields, s)
		if cerr != nil {
			t.Fatalf("seed %d: condition failed to evaluate: %v\ncondition: %s", seed, cerr, pf.Fields.Condition)
		}
		if len(d.Violations) > 0 {
			st.violations++
			if !called {
				t.Fatalf("seed %d: SECURITY HOLE: the evaluator finds %s but the apiserver would not call the fields webhook\nrequest: %s\npolicies: %s\nfilter: %+v",
					seed, d.Violations[0].Message, describe(s), mustJSON(specs), pf.Fields)
			}
		} else if s.req.Operation == policy.Update && s.req.SubResource == "" {
			st.clean++
			if !called {
				st.cleanSkipped++
			}
		}
		sd, err := set.CheckStamp(&s.req, testEnv)
		if err != nil {
			t.Fatalf("seed %d: evaluate stamp: %v", seed, err)
		}
		if len(sd.Violations) > 0 {
			st.stampViolations++
			called, cerr := calls(t, pf.Stamp, stamp, s)
			if cerr != nil || !called {
				t.Fatalf("seed %d: SECURITY HOLE: stamp violation %s not sent to the stamp webhook (err %v)\nrequest: %s\npolicies: %s\nfilter: %+v",
					seed, sd.Violations[0].Message, cerr, describe(s), mustJSON(specs), pf.Stamp)
			}
		}
	}
}

func describe(s sample) string {
	return fmt.Sprintf("%s %s/%s sub=%q ns=%q name=%q user=%+v\n old=%s\n new=%s\n options=%s",
		s.req.Operation, s.req.Group, s.req.Resource, s.req.SubResource, s.req.Namespace, s.req.Name, s.req.User,
		s.req.OldObject, s.req.Object, s.req.Options)
}

// TestPrefilterNeverSkipsAViolation is the pre-filter's safety property,
// seeded: over generated policies and requests, every write the evaluator
// denies, warns about or audits is sent to the webhook by the apiserver's
// own match-condition code. It also checks that the filter filters.
func TestPrefilterNeverSkipsAViolation(t *testing.T) {
	var st propertyStats
	for seed := range uint64(300) {
		checkPrefilter(t, seed, 60, &st)
	}
	t.Logf("violations %d (stamp %d), clean updates %d, of which skipped %d", st.violations, st.stampViolations, st.clean, st.cleanSkipped)
	if st.violations < 500 || st.stampViolations < 100 {
		t.Fatalf("the generator found too few violations (%d, stamp %d) for the property to mean much", st.violations, st.stampViolations)
	}
	// The converse, statistically: a filter that is always true is safe
	// and useless. Clean updates include writes by non-owners that change
	// nothing guarded; most of them must never reach the webhook.
	if st.cleanSkipped*2 < st.clean {
		t.Fatalf("only %d of %d clean updates were filtered out", st.cleanSkipped, st.clean)
	}
}

// FuzzPrefilter runs the same property from fuzzed seeds:
// go test -fuzz FuzzPrefilter ./policy/
func FuzzPrefilter(f *testing.F) {
	f.Add(uint64(1))
	f.Add(uint64(0xdecafbad))
	f.Fuzz(func(t *testing.T, seed uint64) {
		var st propertyStats
		checkPrefilter(t, seed, 20, &st)
	})
}
