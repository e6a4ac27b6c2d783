package replay

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/policy"
)

const testPolicies = `apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: shop}
spec:
  action: Deny
  match:
    resources: [{group: apps, resource: deployments}]
    namespaces: [shop]
  requireResourceVersion: true
  requireDeletePreconditions: uid
  fieldOwners:
  - path: spec.replicas
    writers: {serviceAccounts: [kube-system/hpa]}
  immutableFields:
  - path: metadata.labels["team"]
    action: Warn
`

func testSet(t testing.TB) *policy.Set { return testSetFrom(t, testPolicies) }

func testSetFrom(t testing.TB, yaml string) *policy.Set {
	t.Helper()
	ps, err := policy.Load(strings.NewReader(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return policy.NewSet(ps...)
}

// ev builds one ResponseComplete event of a deployment in shop.
type ev struct {
	id, level, verb, user, name, refRV string
	code                               int
	msg                                string // responseStatus.message
	req, resp                          string
	sec                                int
}

func (e ev) line() string {
	level := e.level
	if level == "" {
		level = "RequestResponse"
	}
	name := e.name
	if name == "" {
		name = "web"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":%q,"auditID":%q,"stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/shop/deployments/%s","verb":%q,`, level, e.id, name, e.verb)
	fmt.Fprintf(&b, `"user":{"username":"system:serviceaccount:x:driver"},"impersonatedUser":{"username":%q,"groups":["system:authenticated"]},`, e.user)
	fmt.Fprintf(&b, `"objectRef":{"resource":"deployments","namespace":"shop","name":%q,"apiGroup":"apps","apiVersion":"v1","resourceVersion":%q},`, name, e.refRV)
	if e.msg != "" {
		fmt.Fprintf(&b, `"responseStatus":{"metadata":{},"code":%d,"message":%q},`, e.code, e.msg)
	} else {
		fmt.Fprintf(&b, `"responseStatus":{"metadata":{},"code":%d},`, e.code)
	}
	if e.req != "" {
		fmt.Fprintf(&b, `"requestObject":%s,`, e.req)
	}
	if e.resp != "" {
		fmt.Fprintf(&b, `"responseObject":%s,`, e.resp)
	}
	fmt.Fprintf(&b, `"requestReceivedTimestamp":"2026-12-01T10:00:%02d.000000Z","stageTimestamp":"2026-12-01T10:00:%02d.001000Z"}`, e.sec, e.sec)
	return b.String()
}

func deploy(rv string, replicas int, team string) string {
	rvField := ""
	if rv != "" {
		rvField = `,"resourceVersion":"` + rv + `"`
	}
	return fmt.Sprintf(`{"kind":"Deployment","apiVersion":"apps/v1","metadata":{"name":"web","namespace":"shop"%s,"labels":{"team":%q}},"spec":{"replicas":%d}}`, rvField, team, replicas)
}

func replayLines(t *testing.T, lines ...string) (*Report, map[string]*Write) {
	t.Helper()
	writes := map[string]*Write{}
	r, err := New(Options{Policies: testSet(t), OnWrite: func(w *Write) {
		c := *w
		c.Violations = append([]policy.Violation(nil), w.Violations...)
		c.Undecidable = append([]policy.RuleRef(nil), w.Undecidable...)
		writes[w.AuditID] = &c
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if err := r.Event([]byte(l)); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
	}
	return r.Report(), writes
}

func kinds(w *Write) string {
	var out []string
	for _, v := range w.Violations {
		out = append(out, v.Policy+"/"+v.RuleName()+"/"+string(v.Action))
	}
	return strings.Join(out, " ")
}

func TestReplayDecidesAsAdmissionWould(t *testing.T) {
	lines := []string{
		// 1: create, stored at 10.
		ev{id: "create", verb: "create", user: "alice", code: 201, req: deploy("", 3, "a"), resp: deploy("10", 3, "a"), sec: 1}.line(),
		// 2: alice scales by PUT from 10: she does not own spec.replicas.
		ev{id: "scale-by-alice", verb: "update", user: "alice", refRV: "10", code: 200, req: deploy("10", 5, "a"), resp: deploy("11", 5, "a"), sec: 2}.line(),
		// 3: the autoscaler scales from 11: allowed; the team label changes: a warning.
		ev{id: "hpa-and-label", verb: "update", user: "system:serviceaccount:kube-system:hpa", refRV: "11", code: 200, req: deploy("11", 2, "b"), resp: deploy("12", 2, "b"), sec: 3}.line(),
		// 4: a stampless PUT: refused by the stamp rule, 422.
		ev{id: "stampless", verb: "update", user: "script", code: 200, req: deploy("", 2, "b"), resp: deploy("13", 2, "b"), sec: 4}.line(),
		// 5: a patch the apiserver refused: the patched object is unknown.
		ev{id: "refused-patch", verb: "patch", user: "bob", code: 403, req: `{"spec":{"replicas":9}}`, resp: `{"kind":"Status","code":403}`, sec: 5}.line(),
		// 6: an update of an object the log never saw.
		ev{id: "mid-history", name: "other", verb: "update", user: "bob", refRV: "7", code: 200, req: `{"metadata":{"name":"other","resourceVersion":"7"},"spec":{"replicas":1}}`, resp: `{"metadata":{"name":"other","resourceVersion":"14"},"spec":{"replicas":1}}`, sec: 6}.line(),
		// 7: a delete at Metadata level: its options are not in the log.
		ev{id: "delete-metadata", level: "Metadata", verb: "delete", user: "bob", code: 200, sec: 7}.line(),
		// 8: a delete with no body: no precondition.
		ev{id: "delete-bare", verb: "delete", user: "bob", code: 200, sec: 8}.line(),
		// 9: a version conflict: the fields phase never ran.
		ev{id: "conflict", verb: "update", user: "alice", refRV: "10", code: 409, req: deploy("10", 7, "a"), sec: 9}.line(),
	}
	rep, writes := replayLines(t, lines...)
	for id, want := range map[string]string{
		"create":          "",
		"scale-by-alice":  "shop/fieldOwners[0]/Deny",
		"hpa-and-label":   "shop/immutableFields[0]/Warn",
		"stampless":       "shop/requireResourceVersion/Deny",
		"refused-patch":   "",
		"mid-history":     "",
		"delete-metadata": "",
		"delete-bare":     "shop/requireDeletePreconditions/Deny",
		"conflict":        "",
	} {
		w := writes[id]
		if w == nil {
			t.Fatalf("%s: not replayed", id)
		}
		if got := kinds(w); got != want {
			t.Errorf("%s: violations %q, want %q (undecidable %v: %s)", id, got, want, w.Undecidable, w.Reason)
		}
	}
	for id, reason := range map[string]string{
		"refused-patch":   "patch was refused before it was applied",
		"mid-history":     "does not hold the object at resourceVersion 7",
		"delete-metadata": "options are not in the log",
	} {
		if w := writes[id]; len(w.Undecidable) == 0 || !strings.Contains(w.Reason, reason) {
			t.Errorf("%s: undecidable %v reason %q, want one with %q", id, w.Undecidable, w.Reason, reason)
		}
	}
	if w := writes["stampless"]; !w.Refused || w.RefusedCode != 422 || !strings.Contains(w.Message, `metadata.resourceVersion: Invalid value: ""`) {
		t.Errorf("stampless: refused %v code %d message %q", w.Refused, w.RefusedCode, w.Message)
	}
	if w := writes["scale-by-alice"]; !w.Refused || w.RefusedCode != 422 || !strings.Contains(w.Message, "(3 -> 5)") {
		t.Errorf("scale-by-alice: refused %v code %d message %q", w.Refused, w.RefusedCode, w.Message)
	}
	if w := writes["hpa-and-label"]; w.Refused {
		t.Errorf("a warning refused the write: %q", w.Message)
	}
	counts := map[string]RuleCounts{}
	for _, c := range rep.Rules {
		counts[c.Rule] = c
	}
	owner := counts["fieldOwners[0]"]
	if owner.Denied != 1 || owner.Undecidable != 2 || owner.Allowed != 1 {
		t.Errorf("fieldOwners[0] counts %+v: want 1 denied (alice), 1 allowed (hpa; the stampless PUT never reaches the fields phase), 2 undecidable (patch, mid-history)", owner)
	}
	if len(rep.TopWriters) != 3 || rep.TopWriters[0].Refused != 1 {
		t.Errorf("top writers %+v", rep.TopWriters)
	}
	if rep.Writes != uint64(len(lines)) {
		t.Errorf("writes %d, want %d", rep.Writes, len(lines))
	}
}

// TestAFieldsRefusalReachedTheFieldsPhase: the fields webhook answers 422
// as the apiserver's own validation does; a 422 that names the webhook was
// decided by the fields rules, any other 422 came before them.
func TestAFieldsRefusalReachedTheFieldsPhase(t *testing.T) {
	_, writes := replayLines(t,
		ev{id: "create", verb: "create", user: "alice", code: 201, req: deploy("", 3, "a"), resp: deploy("10", 3, "a"), sec: 1}.line(),
		ev{id: "refused-by-stampguard", verb: "update", user: "alice", refRV: "10", code: 422,
			msg: fieldsRefusal + `: ConcurrencyPolicy "shop": spec.replicas is owned`, req: deploy("10", 5, "a"), sec: 2}.line(),
		ev{id: "invalid", verb: "update", user: "alice", refRV: "10", code: 422,
			msg: `Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1`, req: deploy("10", 6, "a"), sec: 3}.line(),
	)
	if w := writes["refused-by-stampguard"]; w == nil || kinds(w) != "shop/fieldOwners[0]/Deny" || !w.Refused {
		t.Errorf("the webhook's own refusal: %+v", w)
	}
	if w := writes["invalid"]; w == nil || kinds(w) != "" {
		t.Errorf("a 422 of the apiserver's validation was decided by the fields rules: %+v", w)
	}
}

func TestFilesReadGzipAndRotationInAnyOrder(t *testing.T) {
	dir := t.TempDir()
	first := ev{id: "create", verb: "create", user: "alice", code: 201, req: deploy("", 3, "a"), resp: deploy("10", 3, "a"), sec: 1}.line()
	second := ev{id: "scale", verb: "update", user: "alice", refRV: "10", code: 200, req: deploy("10", 5, "a"), resp: deploy("11", 5, "a"), sec: 2}.line()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write([]byte(first + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "audit-2026-12-01T09-00-00.000.log.gz")
	cur := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(old, gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cur, []byte("not json\n"+second+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := New(Options{Policies: testSet(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The current file first: the order of the events decides.
	if err := Files(t.Context(), r, []string{cur, old}); err != nil {
		t.Fatal(err)
	}
	rep := r.Report()
	if rep.Skipped != 1 || rep.Writes != 2 || len(rep.Refused) != 1 || rep.Refused[0].AuditID != "scale" {
		t.Fatalf("skipped %d writes %d refused %+v: the create in the rotated file must come first", rep.Skipped, rep.Writes, rep.Refused)
	}
}

// A rule broken by a write the apiserver would never have sent to the
// webhook (the configurations' matchConditions and namespaceSelector, as
// webhookconfig.Configurations builds them) is no decision.
func TestReplayAsksTheWebhookConfigurations(t *testing.T) {
	set := testSetFrom(t, `apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: cms}
spec:
  match: {resources: [{resource: configmaps}]}
  requireResourceVersion: true
`)
	cm := func(id, ns, labels string) string {
		obj := fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c","namespace":%q,"labels":%s},"data":{"a":"b"}}`, ns, labels)
		return fmt.Sprintf(`{"level":"RequestResponse","auditID":%q,"stage":"ResponseComplete","verb":"update","requestURI":"/api/v1/namespaces/%s/configmaps/c","user":{"username":"bob","groups":["system:authenticated"]},"objectRef":{"resource":"configmaps","namespace":%q,"name":"c","apiVersion":"v1"},"responseStatus":{"code":200},"requestObject":%s,"stageTimestamp":"2026-12-01T10:00:00.000001Z"}`, id, ns, ns, obj)
	}
	nsGet := `{"level":"RequestResponse","auditID":"ns","stage":"ResponseComplete","verb":"get","requestURI":"/api/v1/namespaces/frozen","user":{"username":"bob"},"objectRef":{"resource":"namespaces","name":"frozen","apiVersion":"v1"},"responseStatus":{"code":200},"responseObject":{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"frozen","resourceVersion":"5","labels":{"stampguard.dev/exempt":"true"}}},"stageTimestamp":"2026-12-01T09:00:00Z"}`
	writes := map[string]*Write{}
	r, err := New(Options{Policies: set, OnWrite: func(w *Write) { c := *w; c.Violations = slices.Clone(w.Violations); writes[w.AuditID] = &c }})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{nsGet, cm("plain", "team", `{"app":"x"}`), cm("helm", "team", `{"owner":"helm"}`), cm("exempt", "frozen", `{}`), cm("system", "kube-system", `{}`)} {
		if err := r.Event([]byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	if w := writes["plain"]; len(w.Violations) != 1 || !w.Refused {
		t.Errorf("a stampless update of a configmap: violations %v refused %v", w.Violations, w.Refused)
	}
	for _, id := range []string{"helm", "exempt"} {
		if w := writes[id]; len(w.Violations) != 0 || w.Refused || !w.NotSent {
			t.Errorf("%s: violations %v refused %v not sent %v: the apiserver never calls the webhook for it", id, w.Violations, w.Refused, w.NotSent)
		}
	}
	if w := writes["system"]; len(w.Violations) != 0 || w.Refused {
		t.Errorf("kube-system: violations %v: protected", w.Violations)
	}
}
