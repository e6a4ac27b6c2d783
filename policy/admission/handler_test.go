package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/semaphore"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission/admissiontest"
)

func testHandlers(t testing.TB, set *policy.Set) (stamp, fields http.Handler) {
	t.Helper()
	return Handlers(NewStaticSource(set), &policy.Environment{}, NewMetrics(nil), slog.New(slog.DiscardHandler), 1<<20)
}

func post(h http.Handler, body []byte) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/fields", bytes.NewReader(body)))
	return rec
}

// decodeAnswer reads the answer with the real k8s.io types, as the apiserver would.
func decodeAnswer(t *testing.T, rec *httptest.ResponseRecorder) *admissionv1.AdmissionResponse {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
	}
	var rv admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &rv); err != nil {
		t.Fatalf("answer is not an AdmissionReview: %v", err)
	}
	if rv.APIVersion != "admission.k8s.io/v1" || rv.Kind != "AdmissionReview" || rv.Response == nil {
		t.Fatalf("answer lacks its type or response: %s", rec.Body)
	}
	return rv.Response
}

func TestFieldsAnswer(t *testing.T) {
	_, fields := testHandlers(t, tenRules(t))
	old := admissiontest.BigDeployment(3, "registry.example.com/shop/app:1", "a")

	t.Run("a pass is allowed without annotations", func(t *testing.T) {
		resp := decodeAnswer(t, post(fields, admissiontest.UpdateReview(t, "alice", old, admissiontest.BigDeployment(3, "registry.example.com/shop/app:1", "a"))))
		if !resp.Allowed || len(resp.AuditAnnotations) != 0 || len(resp.Warnings) != 0 || resp.UID != "0c9e4b8e-7f2f-4d7c-9d7a-1f2e3d4c5b6a" {
			t.Fatalf("got %+v", resp)
		}
	})
	t.Run("a Warn violation is allowed with a warning and an annotation", func(t *testing.T) {
		resp := decodeAnswer(t, post(fields, admissiontest.UpdateReview(t, "alice", old, admissiontest.BigDeployment(3, "registry.example.com/shop/app:2", "a"))))
		if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "containers[name=app].image is owned by argocd, group deployers") {
			t.Fatalf("got %+v", resp)
		}
		want := `[{"policy":"deployments","rule":"fieldOwners[1]","action":"Warn","path":"spec.template.spec.containers[name=app].image","writer":"alice"}]`
		if got := resp.AuditAnnotations["field-owner"]; got != want {
			t.Fatalf("annotation %s, want %s", got, want)
		}
	})
	t.Run("a Deny violation is refused with 422 Invalid, naming the object, and a cause per field", func(t *testing.T) {
		resp := decodeAnswer(t, post(fields, admissiontest.UpdateReview(t, "alice", old, admissiontest.BigDeployment(5, "registry.example.com/shop/app:1", "b"))))
		if resp.Allowed || resp.Result == nil || resp.Result.Code != 422 || resp.Result.Reason != "Invalid" {
			t.Fatalf("got %+v", resp)
		}
		if d := resp.Result.Details; d == nil || d.Name != "web" || d.Group != "apps" || d.Kind != "Deployment" {
			t.Fatalf("details do not name the Deployment: %+v", d)
		}
		for _, c := range resp.Result.Details.Causes {
			if c.Type != "FieldValueForbidden" || c.Field == "" {
				t.Fatalf("cause %+v, want FieldValueForbidden on a field", c)
			}
		}
		if n := len(resp.Result.Details.Causes); n != 2 {
			t.Fatalf("want causes for spec.replicas and the team label, got %d: %+v", n, resp.Result.Details.Causes)
		}
		if !strings.Contains(resp.Result.Message, "(3 -> 5)") || !strings.Contains(resp.Result.Message, `("a" -> "b")`) {
			t.Fatalf("message lacks old and new values: %s", resp.Result.Message)
		}
		if resp.AuditAnnotations["field-owner"] == "" || resp.AuditAnnotations["immutable-field"] == "" {
			t.Fatalf("annotations missing: %v", resp.AuditAnnotations)
		}
	})
	t.Run("the answer is the same when asked twice", func(t *testing.T) {
		body := admissiontest.UpdateReview(t, "alice", old, admissiontest.BigDeployment(5, "registry.example.com/shop/app:2", "b"))
		a, b := post(fields, body).Body.String(), post(fields, body).Body.String()
		if a != b {
			t.Fatalf("answers differ:\n%s\n%s", a, b)
		}
	})
}

func TestStampAnswer(t *testing.T) {
	p, _ := policy.Compile(stampPolicy())
	stamp, _ := testHandlers(t, policy.NewSet(p))
	cur := admissiontest.BigDeployment(3, "x", "a")
	cur.ResourceVersion = ""
	resp := decodeAnswer(t, post(stamp, admissiontest.UpdateReview(t, "alice", admissiontest.BigDeployment(3, "x", "a"), cur)))
	if resp.Allowed || resp.Result.Code != 422 || resp.Result.Reason != "Invalid" {
		t.Fatalf("got %+v", resp)
	}
	if c := resp.Result.Details.Causes; len(c) != 1 || c[0].Field != "metadata.resourceVersion" || c[0].Type != "FieldValueInvalid" {
		t.Fatalf("causes %+v", c)
	}
	if !strings.Contains(resp.Result.Message, `ConcurrencyPolicy "stamp": metadata.resourceVersion: Invalid value: "": must be specified for an update`) {
		t.Fatalf("message %q", resp.Result.Message)
	}
}

func TestBadReviews(t *testing.T) {
	_, fields := testHandlers(t, tenRules(t))
	const denied = 200
	cases := []struct {
		name string
		body string
		code int
		want string
	}{
		{"an empty body", ``, 400, "expected an object"},
		{"not JSON", `<xml/>`, 400, "expected an object"},
		{"the wrong kind", `{"apiVersion":"v1","kind":"Pod","request":{}}`, 400, `got kind "Pod"`},
		{"an old review version", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`, denied, "want AdmissionReview admission.k8s.io/v1"},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, 400, "no request"},
		{"no uid", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"UPDATE"}}`, 400, "uid is empty"},
		{"groups of the wrong type", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","userInfo":{"groups":"admins"}}}`, denied, "userInfo"},
		{"a truncated object", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","object":{"spec":`, denied, "malformed JSON"},
		{"nesting deeper than the apiserver's 10000 levels", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","object":{"a":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}}}`, denied, "nesting too deep"},
		{"a body over the limit", `{"pad":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "larger than"},
		{"a body over the limit that names its request", `{"request":{"uid":"big","pad":"` + strings.Repeat("x", 1<<20) + `"}}`, denied, "larger than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := post(fields, []byte(c.body))
			if c.code == denied {
				// A review that names its request is answered with a
				// denial: an HTTP error would be left to failurePolicy.
				resp := decodeAnswer(t, rec)
				if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, c.want) || resp.UID == "" {
					t.Fatalf("got %+v, want a denial saying %q", resp, c.want)
				}
				return
			}
			if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.want) {
				t.Fatalf("HTTP %d %q, want %d containing %q", rec.Code, rec.Body, c.code, c.want)
			}
		})
	}
	t.Run("a chunked body over the limit", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodPost, "/fields", io.MultiReader(strings.NewReader(`{"pad":"`), strings.NewReader(strings.Repeat("x", 1<<20))))
		req.ContentLength = -1 // unknown: read up to the limit
		rec := httptest.NewRecorder()
		fields.ServeHTTP(rec, req)
		if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "larger than") {
			t.Fatalf("HTTP %d %q, want 413", rec.Code, rec.Body)
		}
	})
	t.Run("an unknown kind passes untouched", func(t *testing.T) {
		body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","resource":{"group":"example.com","version":"v1","resource":"widgets"},"operation":"UPDATE","object":{"weird":[1,2,{"x":null}]},"oldObject":7}}`
		if resp := decodeAnswer(t, post(fields, []byte(body))); !resp.Allowed {
			t.Fatalf("got %+v", resp)
		}
	})
	t.Run("an object of the wrong shape for a rule is a clear refusal, not a panic", func(t *testing.T) {
		body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","resource":{"group":"apps","version":"v1","resource":"deployments"},"operation":"UPDATE","userInfo":{"username":"alice"},"object":{"spec":{"replicas":[1,}},"oldObject":{"spec":{"replicas":1}}}}`
		rec := post(fields, []byte(body))
		if rec.Code != 400 {
			resp := decodeAnswer(t, rec)
			if resp.Allowed || resp.Result.Code != 400 {
				t.Fatalf("got %+v", resp)
			}
		}
	})
	t.Run("GET is refused", func(t *testing.T) {
		rec := httptest.NewRecorder()
		fields.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/fields", nil))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Fatalf("HTTP %d", rec.Code)
		}
	})
}

func TestReadReviewGrowsNoFurtherThanTheLimit(t *testing.T) {
	const limit = 1 << 20
	cases := []struct {
		name   string
		size   int
		maxCap int
	}{
		{"a body grows by doubling as it arrives, whatever it declared", 300 << 10, 512 << 10},
		{"a body over the limit stops at limit+1 bytes", 3 << 20, limit + 1},
		{"an empty body", 0, 4 << 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			budget := semaphore.NewWeighted(2 * (limit + 1))
			charged := &chargedBuffer{buf: &buf, budget: budget}
			n, err := readReview(t.Context(), charged, bytes.NewReader(bytes.Repeat([]byte("x"), c.size)), limit)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(min(c.size, limit+1)); n != want || int64(buf.Len()) != want {
				t.Errorf("read %d bytes (buffer %d), want %d", n, buf.Len(), want)
			}
			if buf.Cap() > c.maxCap {
				t.Errorf("the buffer grew to %d bytes, want at most %d", buf.Cap(), c.maxCap)
			}
			if charged.charged != charge(int64(buf.Cap())) {
				t.Errorf("the budget is charged %d bytes for a buffer of %d", charged.charged, buf.Cap())
			}
			charged.release()
			if !budget.TryAcquire(2 * (limit + 1)) {
				t.Error("the budget was not whole again after the release")
			}
		})
	}
}

// A review without a declared length fails at once when the budget is
// spent: it would wait while holding a charge.
func TestReadReviewOfUnknownLengthFailsWhenTheBudgetIsSpent(t *testing.T) {
	budget := semaphore.NewWeighted(16 << 10)
	if !budget.TryAcquire(12 << 10) { // held by other reviews
		t.Fatal("could not take the budget")
	}
	var buf bytes.Buffer
	charged := &chargedBuffer{buf: &buf, budget: budget}
	_, err := readReview(t.Context(), charged, bytes.NewReader(bytes.Repeat([]byte("x"), 64<<10)), 1<<20)
	if !errors.Is(err, errBudget) {
		t.Fatalf("err %v, want errBudget", err)
	}
	if buf.Cap() > 8<<10 { // 4 KiB free of charge, 4 KiB charged
		t.Fatalf("the buffer grew to %d bytes with 4 KiB of budget left", buf.Cap())
	}
	charged.release()
}

// Reviews that declare their length reserve it whole while holding no
// charge: two that do not fit the budget together take turns instead of
// deadlocking, and one that does not get its turn before its deadline
// fails with errBudget.
func TestDeclaredReviewsTakeTurnsForTheBudget(t *testing.T) {
	const size = 600 << 10
	budget := semaphore.NewWeighted(1 << 20) // less than two reviews
	read := func(ctx context.Context, body io.Reader) (int64, *chargedBuffer, error) {
		var buf bytes.Buffer
		c := &chargedBuffer{buf: &buf, budget: budget, reserve: size + 1}
		n, err := readReview(ctx, c, body, 1<<20)
		return n, c, err
	}
	// The first review has its reservation and waits for the rest of its body.
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	var firstCharge *chargedBuffer
	go func() {
		n, c, err := read(t.Context(), pr)
		firstCharge = c
		if err == nil && n != size {
			err = fmt.Errorf("read %d bytes, want %d", n, size)
		}
		first <- err
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 8<<10)); err != nil {
		t.Fatal(err)
	}
	// The second cannot get its reservation while the first holds its own.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, c, err := read(ctx, bytes.NewReader(bytes.Repeat([]byte("y"), size))); !errors.Is(err, errBudget) {
		t.Fatalf("the second review while the first holds the budget: %v, want errBudget", err)
	} else {
		c.release()
	}
	// It waits its turn: once the first is read and released, it gets it.
	second := make(chan error, 1)
	go func() {
		n, c, err := read(t.Context(), bytes.NewReader(bytes.Repeat([]byte("y"), size)))
		if err == nil && n != size {
			err = fmt.Errorf("read %d bytes, want %d", n, size)
		}
		if c != nil {
			c.release()
		}
		second <- err
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), size-8<<10)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	firstCharge.release()
	if err := <-second; err != nil {
		t.Fatalf("the second review after the first released the budget: %v", err)
	}
}

func TestReviewUIDFromDamagedReviews(t *testing.T) {
	for _, c := range []struct{ name, body, uid string }{
		{"a truncated review", `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u-1","object":{"a":[`, "u-1"},
		{"a review malformed after the uid", `{"request":{"uid":"u-2","object":{]}}`, "u-2"},
		{"an escaped uid", `{"request":{"uid":"u\u002d3"}}`, "u-3"},
		{"no request", `{"kind":"AdmissionReview"}`, ""},
		{"damage before the uid", `{"request":{"name":tru,"uid":"u"}}`, ""},
		{"not JSON", `<xml/>`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := reviewUID([]byte(c.body)); got != c.uid {
				t.Fatalf("uid %q, want %q", got, c.uid)
			}
		})
	}
}

// After oversized bodies, the Go heap holds no buffer they grew: a pooled
// 16 MiB buffer per concurrent request is how the webhook once went from
// 31 MB to 155 MB RSS and stayed there. sync.Pool keeps its items through
// one collection (its victim cache), so one runtime.GC shows what a pool
// would still hold.
func TestOversizedReviewsLeaveNoBuffersBehind(t *testing.T) {
	const limit = DefaultMaxReviewBytes
	stamp, _ := Handlers(NewStaticSource(tenRules(t)), &policy.Environment{}, NewMetrics(nil), slog.New(slog.DiscardHandler), limit)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	big := bytes.Repeat([]byte("x"), 20<<20) // shared by the requests; read, never copied by the test
	before := heap()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			body := io.Reader(bytes.NewReader(big))
			if i%2 == 0 {
				body = io.LimitReader(body, limit-1<<10) // under the limit: buffered in full, then refused as JSON
			}
			req := httptest.NewRequest(http.MethodPost, "/stamp", body)
			req.ContentLength = -1 // chunked: the handler must buffer to find the size
			rec := httptest.NewRecorder()
			stamp.ServeHTTP(rec, req)
			// 503: no room in the budget for a body of unknown length
			// while the others hold it.
			if rec.Code != http.StatusRequestEntityTooLarge && rec.Code != http.StatusBadRequest && rec.Code != http.StatusServiceUnavailable {
				t.Errorf("HTTP %d for a %s body", rec.Code, map[bool]string{true: "large", false: "oversized"}[i%2 == 0])
			}
		})
	}
	wg.Wait()
	after := heap()
	runtime.KeepAlive(big)
	// The bound is one limit: far below the 8 x 8-16 MiB the requests grew.
	if grown := int64(after) - int64(before); grown > limit {
		t.Fatalf("the heap kept %d MiB after 8 large reviews were answered (before %d MiB, after %d MiB)", grown>>20, before>>20, after>>20)
	}
}

// FuzzReview feeds arbitrary bytes through decode and evaluation of both
// endpoints: whatever arrives, the answer is an HTTP status, never a panic.
func FuzzReview(f *testing.F) {
	p, _ := policy.Compile(stampPolicy())
	stamp, fields := testHandlers(f, policy.NewSet(p, tenRulesPolicy(f)))
	old := admissiontest.BigDeployment(3, "a", "x")
	f.Add(admissiontest.UpdateReview(f, "alice", old, admissiontest.BigDeployment(5, "b", "y")))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","resource":{"group":"apps","resource":"deployments"},"operation":"DELETE","name":"","options":{"preconditions":{"uid":7}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","resource":{"group":"apps","resource":"deployments"},"subResource":"scale","operation":"UPDATE","object":{"spec":{"replicas":"3"}},"oldObject":{"spec":{}}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, h := range []http.Handler{stamp, fields} {
			rec := post(h, body)
			if rec.Code == http.StatusInternalServerError {
				t.Fatalf("500 for %q: %s", body, rec.Body)
			}
			if rec.Code == http.StatusOK {
				var rv admissionv1.AdmissionReview
				if err := json.Unmarshal(rec.Body.Bytes(), &rv); err != nil || rv.Response == nil {
					t.Fatalf("200 with an unreadable answer %q: %v", rec.Body, err)
				}
			}
		}
	})
}

// The hand-written annotation must be the JSON that annotationValue
// documents, whatever the strings hold.
func TestAnnotationEncoding(t *testing.T) {
	odd := "p\"\\\n\t\x01<&>ü"
	d := policy.Decision{Violations: []policy.Violation{
		{Policy: odd, Rule: policy.RuleFieldOwner, Index: 12, Action: "Deny", Path: `metadata.labels["a"]`, Writer: odd},
		{Policy: "b", Rule: policy.RuleImmutableField, Index: 0, Action: "Audit", Path: "x", Writer: "w"},
		{Policy: "c", Rule: policy.RuleFieldOwner, Index: 1, Action: "Warn", Path: "y", Writer: "w"},
	}}
	got := auditAnnotations(d)
	for kind, want := range map[string][]annotationValue{
		"field-owner": {
			{Policy: odd, Rule: "fieldOwners[12]", Action: "Deny", Path: `metadata.labels["a"]`, Writer: odd},
			{Policy: "c", Rule: "fieldOwners[1]", Action: "Warn", Path: "y", Writer: "w"},
		},
		"immutable-field": {{Policy: "b", Rule: "immutableFields[0]", Action: "Audit", Path: "x", Writer: "w"}},
	} {
		var vals []annotationValue
		if err := json.Unmarshal([]byte(got[kind]), &vals); err != nil {
			t.Fatalf("%s: %q is not JSON: %v", kind, got[kind], err)
		}
		if fmt.Sprint(vals) != fmt.Sprint(want) {
			t.Fatalf("%s: got %+v, want %+v", kind, vals, want)
		}
	}
	if len(got) != 2 {
		t.Fatalf("keys %v", got)
	}
}

// Denials are logged at info at most denialLinesPerSecond a second; the
// next line logged says how many were not.
func TestDenialLinesAreLimited(t *testing.T) {
	var l logLimit
	t0 := time.Unix(1_000_000, 0)
	for i := range denialLinesPerSecond {
		if ok, unlogged := l.allow(t0.Add(time.Duration(i) * time.Millisecond)); !ok || unlogged != 0 {
			t.Fatalf("line %d of the second: allowed %v, unlogged %d", i, ok, unlogged)
		}
	}
	for i := range 5 {
		if ok, _ := l.allow(t0.Add(900 * time.Millisecond)); ok {
			t.Fatalf("line %d past the limit allowed", denialLinesPerSecond+i)
		}
	}
	if ok, unlogged := l.allow(t0.Add(time.Second)); !ok || unlogged != 5 {
		t.Fatalf("first line of the next second: allowed %v, unlogged %d, want true and 5", ok, unlogged)
	}
	if ok, unlogged := l.allow(t0.Add(time.Second + time.Millisecond)); !ok || unlogged != 0 {
		t.Fatalf("second line of the next second: allowed %v, unlogged %d, want true and 0", ok, unlogged)
	}
}

// Every denial is counted; at info level only the first lines of a burst
// are logged, at debug level all of them.
func TestDenialsLoggedAndCounted(t *testing.T) {
	body := admissiontest.UpdateReview(t, "alice", admissiontest.BigDeployment(3, "registry.example.com/shop/app:1", "a"), admissiontest.BigDeployment(3, "registry.example.com/shop/app:1", "b"))
	const burst = 3 * denialLinesPerSecond
	for _, c := range []struct {
		level   string
		minimum int // lines
		maximum int
	}{
		{"info", 1, 2 * denialLinesPerSecond}, // the burst may straddle a second
		{"debug", burst, burst},
	} {
		t.Run(c.level, func(t *testing.T) {
			var out bytes.Buffer
			log, err := cli.NewLogger(&out, c.level, "json")
			if err != nil {
				t.Fatal(err)
			}
			m := NewMetrics(nil)
			_, fields := Handlers(NewStaticSource(tenRules(t)), &policy.Environment{}, m, log, 1<<20)
			for range burst {
				if resp := decodeAnswer(t, post(fields, body)); resp.Allowed {
					t.Fatal("the change of the team label was allowed")
				}
			}
			lines := strings.Count(out.String(), `"msg":"concurrency policy violated"`)
			if lines < c.minimum || lines > c.maximum {
				t.Errorf("%d lines for %d denials, want %d to %d:\n%s", lines, burst, c.minimum, c.maximum, out.String())
			}
			if got := testutil.ToFloat64(m.decisions.WithLabelValues("fields", "deployments", "immutable-field", "Deny", "denied")); got != burst {
				t.Errorf("decisions counted %v, want %d", got, burst)
			}
		})
	}
}
