package admission

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/google/cel-go/cel"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission/admissiontest"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// discardWriter is the cheapest ResponseWriter, so the benchmark measures
// the handler rather than the recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// benchReview is the recorded UPDATE: a 15 KB Deployment and its 15 KB old
// version; the writer changes the app image (a Warn rule fires) and nothing
// else, so all ten rules read their values and the answer carries a warning
// and an audit annotation.
func benchReview(b *testing.B) []byte {
	old := admissiontest.BigDeployment(3, "registry.example.com/shop/app:1", "a")
	cur := admissiontest.BigDeployment(3, "registry.example.com/shop/app:2", "a")
	body := admissiontest.UpdateReview(b, "alice", old, cur)
	b.ReportMetric(float64(len(body))/1024, "review-KB")
	return body
}

// BenchmarkAdmissionDecision is one fields-phase decision through the
// mounted http.Handler: read the body, decode, evaluate ten rules, encode.
func BenchmarkAdmissionDecision(b *testing.B) {
	body := benchReview(b)
	_, fields := testHandlers(b, tenRules(b))
	req, _ := http.NewRequest(http.MethodPost, "/fields", nil)
	w := &discardWriter{h: http.Header{}}
	rd := bytes.NewReader(body)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		req.Body = io.NopCloser(rd)
		fields.ServeHTTP(w, req)
	}
}

// celRules are the same ten checks as tenRules, written as a
// ValidatingAdmissionPolicy would write them.
var celRules = []string{
	`object.spec.replicas == oldObject.spec.replicas || request.userInfo.username in ['system:serviceaccount:kube-system:horizontal-pod-autoscaler']`,
	`object.spec.template.spec.containers.filter(c, c.name == 'app').map(c, c.image) == oldObject.spec.template.spec.containers.filter(c, c.name == 'app').map(c, c.image) || request.userInfo.username in ['argocd'] || 'deployers' in request.userInfo.groups`,
	`object.spec.template.spec.containers.filter(c, c.name == 'sidecar').map(c, c.image) == oldObject.spec.template.spec.containers.filter(c, c.name == 'sidecar').map(c, c.image) || request.userInfo.username in ['argocd'] || 'deployers' in request.userInfo.groups`,
	`object.spec.template.metadata.annotations[?'checksum/config'] == oldObject.spec.template.metadata.annotations[?'checksum/config'] || request.userInfo.username in ['argocd'] || 'deployers' in request.userInfo.groups`,
	`object.spec.?minReadySeconds == oldObject.spec.?minReadySeconds || request.userInfo.username in ['argocd'] || 'deployers' in request.userInfo.groups`,
	`object.metadata.labels[?'team'] == oldObject.metadata.labels[?'team']`,
	`object.spec.selector == oldObject.spec.selector`,
	`object.spec.template.spec.?serviceAccountName == oldObject.spec.template.spec.?serviceAccountName`,
	`object.spec.template.spec.containers.map(c, c.name) == oldObject.spec.template.spec.containers.map(c, c.name)`,
	`!has(oldObject.metadata.annotations) || !('owner' in oldObject.metadata.annotations) || object.metadata.annotations[?'owner'] == oldObject.metadata.annotations[?'owner']`,
}

func compileCEL(b *testing.B) []cel.Program {
	env, err := cel.NewEnv(
		cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType), cel.Variable("request", cel.DynType),
		cel.OptionalTypes(),
	)
	if err != nil {
		b.Fatal(err)
	}
	progs := make([]cel.Program, len(celRules))
	for i, src := range celRules {
		ast, iss := env.Compile(src)
		if iss.Err() != nil {
			b.Fatalf("compile %q: %v", src, iss.Err())
		}
		if progs[i], err = env.Program(ast); err != nil {
			b.Fatal(err)
		}
	}
	return progs
}

// BenchmarkAdmissionDecisionCEL does the same decision with the same review
// decoding and answer encoding, but evaluates the rules as compiled CEL
// programs, which need the objects decoded into maps first.
func BenchmarkAdmissionDecisionCEL(b *testing.B) {
	body := benchReview(b)
	progs := compileCEL(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		rv, err := decodeReview(body, nil)
		if err != nil {
			b.Fatal(err)
		}
		var obj, old map[string]any
		if err := json.Unmarshal(rv.req.Object, &obj); err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(rv.req.OldObject, &old); err != nil {
			b.Fatal(err)
		}
		vars := map[string]any{"object": obj, "oldObject": old, "request": map[string]any{
			"userInfo": map[string]any{"username": rv.req.User.Name, "groups": rv.req.User.Groups},
		}}
		var d policy.Decision
		for i, p := range progs {
			out, _, err := p.Eval(vars)
			if err != nil {
				b.Fatalf("rule %d: %v", i, err)
			}
			if out.Value() != true {
				d.Violations = append(d.Violations, policy.Violation{Policy: "deployments", Rule: policy.RuleFieldOwner, Index: i, Action: v1alpha1.ActionWarn, Message: "violated"})
			}
		}
		if len(d.Violations) != 1 {
			b.Fatalf("CEL found %d violations, want 1", len(d.Violations))
		}
		var buf bytes.Buffer
		if err := json.NewEncoder(&buf).Encode(reviewOut{APIVersion: reviewAPIVersion, Kind: "AdmissionReview", Response: answer(rv.uid, phaseFields, d)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvaluateOnly and BenchmarkEvaluateOnlyCEL leave decoding out:
// stampguard reads values from the raw objects, CEL gets maps decoded
// before the loop. This is CEL's best case.
func BenchmarkEvaluateOnly(b *testing.B) {
	rv, err := decodeReview(benchReview(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	set, env := tenRules(b), &policy.Environment{}
	b.ReportAllocs()
	for b.Loop() {
		d, err := set.CheckFields(&rv.req, env)
		if err != nil || len(d.Violations) != 1 {
			b.Fatalf("%d violations, err %v", len(d.Violations), err)
		}
	}
}

func BenchmarkEvaluateOnlyCEL(b *testing.B) {
	rv, err := decodeReview(benchReview(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	progs := compileCEL(b)
	var obj, old map[string]any
	_ = json.Unmarshal(rv.req.Object, &obj)
	_ = json.Unmarshal(rv.req.OldObject, &old)
	vars := map[string]any{"object": obj, "oldObject": old, "request": map[string]any{
		"userInfo": map[string]any{"username": rv.req.User.Name, "groups": rv.req.User.Groups},
	}}
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		for _, p := range progs {
			out, _, err := p.Eval(vars)
			if err != nil {
				b.Fatal(err)
			}
			if out.Value() != true {
				n++
			}
		}
		if n != 1 {
			b.Fatalf("%d violations", n)
		}
	}
}

// TestBenchmarkFixtureDecides keeps the benchmark honest: the recorded
// review must really produce the one Warn violation it is meant to.
func TestBenchmarkFixtureDecides(t *testing.T) {
	old := admissiontest.BigDeployment(3, "registry.example.com/shop/app:1", "a")
	body := admissiontest.UpdateReview(t, "alice", old, admissiontest.BigDeployment(3, "registry.example.com/shop/app:2", "a"))
	if n := len(body); n < 28<<10 || n > 40<<10 {
		t.Fatalf("review is %d bytes, want two ~15 KB objects", n)
	}
	rv, err := decodeReview(body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rv.req.Object); n < 14<<10 {
		t.Fatalf("object is %d bytes, want ~15 KB", n)
	}
	d, err := tenRules(t).CheckFields(&rv.req, &policy.Environment{})
	if err != nil || len(d.Violations) != 1 || d.Action() != v1alpha1.ActionWarn {
		t.Fatalf("got %+v, %v", d, err)
	}
}

// BenchmarkScanFloor only finds where the recorded review ends: one pass
// over its bytes with nothing extracted, the floor under any decoder that
// must read the whole body.
func BenchmarkScanFloor(b *testing.B) {
	body := benchReview(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rawjson.Skip(body, 0); err != nil {
			b.Fatal(err)
		}
	}
}
