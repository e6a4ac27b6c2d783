package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// realEvents returns the JSON lines of analytics/testdata/events.jsonl, real apiserver
// event shapes (see DESIGN.md, "What the audit log says").
func realEvents(tb testing.TB) []string {
	tb.Helper()
	f, err := os.Open("../../analytics/testdata/events.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return lines
}

func micros(s string) int64 {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UnixMicro()
}

// rawObjects are the requestObject and responseObject of event as
// encoding/json reads them ("" for absent or null).
func rawObjects(t *testing.T, event string) (req, resp string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(event), &m); err != nil {
		t.Fatal(err)
	}
	obj := func(k string) string {
		if v := string(m[k]); v != "null" {
			return v
		}
		return ""
	}
	return obj("requestObject"), obj("responseObject")
}

func TestDecodeKeepsTheObjectsAsTheyAre(t *testing.T) {
	var d Decoder
	for i, e := range realEvents(t) {
		var r Row
		if err := d.Decode(e, &r); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		req, resp := rawObjects(t, e)
		if r.RequestObject != req || r.ResponseObject != resp {
			t.Errorf("event %d: objects\n%q\n%q\nwant\n%q\n%q", i, r.RequestObject, r.ResponseObject, req, resp)
		}
	}
}

func TestDecodeRealEventShapes(t *testing.T) {
	events := realEvents(t)
	tests := []struct {
		name  string
		line  int
		check func(t *testing.T, r *Row)
	}{
		{"a version conflict keeps the stale stamp, 409 Conflict and the optimistic-lock message", 0, func(t *testing.T, r *Row) {
			want := Row{AuditID: "6f1c2a0e-8a41-4b7e-9d55-1d2f3c4b5a61", Stage: StageResponseComplete, Level: "RequestResponse",
				Verb: "update", RequestURI: "/api/v1/namespaces/team-a/configmaps/settings",
				User:       "system:serviceaccount:team-a:deployer",
				UserGroups: []string{"system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"},
				UserAgent:  "deployer/v1.4.2 (linux/amd64) kubernetes/$Format", SourceIP: "10.244.1.17",
				APIVersion: "v1", Resource: "configmaps", Namespace: "team-a", Name: "settings",
				ObjectUID: "2c9d4a6b-7e1f-4c3a-8b5d-9f0e1a2b3c4d", Stamp: "4711", Code: 409, Reason: "Conflict",
				Message:               `Operation cannot be fulfilled on configmaps "settings": the object has been modified; please apply your changes to the latest version and try again`,
				RequestReceivedMicros: micros("2026-11-29T08:50:48.120301Z"), StageMicros: micros("2026-11-29T08:50:48.123456Z"),
				AuthzDecision: "allow"}
			want.RequestObject, want.ResponseObject = rawObjects(t, events[0])
			want.Fingerprint = Fingerprint(&want)
			normalize(r)
			normalize(&want)
			if !reflect.DeepEqual(*r, want) {
				t.Errorf("got  %+v\nwant %+v", *r, want)
			}
			if l := r.StageMicros - r.RequestReceivedMicros; l != 3155 {
				t.Errorf("latency = %d µs, want 3155", l)
			}
		}},
		{"a server-side apply field conflict has FieldManagerConflict causes and the field manager from the URI", 1, func(t *testing.T, r *Row) {
			if r.Verb != "patch" || r.Code != 409 || r.FieldManager != "bob-tool" {
				t.Errorf("verb %q code %d field manager %q", r.Verb, r.Code, r.FieldManager)
			}
			if !reflect.DeepEqual(r.CauseReasons, []string{"FieldManagerConflict"}) || !reflect.DeepEqual(r.CauseFields, []string{".data.x"}) {
				t.Errorf("causes %q %q", r.CauseReasons, r.CauseFields)
			}
			if r.Stamp != "" {
				t.Errorf("a patch carries no stamp, got %q", r.Stamp)
			}
		}},
		{"a create of an existing name is 409 AlreadyExists", 2, func(t *testing.T, r *Row) {
			if r.Code != 409 || r.Reason != "AlreadyExists" || r.Verb != "create" {
				t.Errorf("code %d reason %q verb %q", r.Code, r.Reason, r.Verb)
			}
		}},
		{"a delete with a stale uid precondition is a 409 Conflict on delete with the precondition message", 3, func(t *testing.T, r *Row) {
			if r.Code != 409 || r.Verb != "delete" || !strings.Contains(r.Message, "Precondition failed: UID in precondition") {
				t.Errorf("code %d verb %q message %q", r.Code, r.Verb, r.Message)
			}
			if r.StageMicros != micros("2026-11-29T08:50:51.002Z") || r.RequestReceivedMicros != micros("2026-11-29T08:50:51Z") {
				t.Errorf("timestamps without six fraction digits: %d %d", r.RequestReceivedMicros, r.StageMicros)
			}
		}},
		{"an expired list is 410 Expired", 4, func(t *testing.T, r *Row) {
			if r.Code != 410 || r.Reason != "Expired" || r.Verb != "list" || r.Name != "" {
				t.Errorf("code %d reason %q verb %q name %q", r.Code, r.Reason, r.Verb, r.Name)
			}
		}},
		{"a stampless update succeeds with an empty stamp and keeps the stampguard annotations", 5, func(t *testing.T, r *Row) {
			if r.Code != 200 || r.Stamp != "" {
				t.Errorf("code %d stamp %q", r.Code, r.Stamp)
			}
			if !reflect.DeepEqual(r.AnnotationKeys, []string{"stamp.stampguard.io/decision", "stamp.stampguard.io/policy"}) ||
				!reflect.DeepEqual(r.AnnotationValues, []string{"warn", "guard-configmaps"}) {
				t.Errorf("annotations %q = %q", r.AnnotationKeys, r.AnnotationValues)
			}
		}},
		{"a lease update yields the holder identity from requestObject", 6, func(t *testing.T, r *Row) {
			if r.LeaseHolder != "ctrl-7f9c_4b1e2d3c" || r.APIGroup != "coordination.k8s.io" {
				t.Errorf("holder %q group %q", r.LeaseHolder, r.APIGroup)
			}
		}},
		{"a secret's objects never reach the raw event", 7, func(t *testing.T, r *Row) {
			if strings.Contains(r.Raw, "aHVudGVyMg") || strings.Contains(r.Raw, `"data"`) {
				t.Errorf("raw event still has the secret: %s", r.Raw)
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(r.Raw), &v); err != nil {
				t.Fatalf("redacted raw event is not JSON: %v", err)
			}
			if v["requestObject"] != nil || v["responseObject"] != nil || v["auditID"] != r.AuditID {
				t.Errorf("redacted event: %v", v)
			}
		}},
		{"a dry-run scale through an impersonated user names the effective writer and the subresource", 8, func(t *testing.T, r *Row) {
			if !r.DryRun || r.Subresource != "scale" || r.Writer() != "system:serviceaccount:kube-system:horizontal-pod-autoscaler" || r.User != "admin" {
				t.Errorf("dry run %v subresource %q writer %q user %q", r.DryRun, r.Subresource, r.Writer(), r.User)
			}
			if r.SourceIP != "127.0.0.1" || r.LeaseHolder != "" {
				t.Errorf("source ip %q holder %q", r.SourceIP, r.LeaseHolder)
			}
		}},
		{"a RequestReceived event has no response status", 9, func(t *testing.T, r *Row) {
			if l := r.StageMicros - r.RequestReceivedMicros; r.Stage != StageRequestReceived || r.Code != 0 || l != 0 {
				t.Errorf("stage %q code %d latency %d", r.Stage, r.Code, l)
			}
		}},
		{"a Panic event carries the 500", 10, func(t *testing.T, r *Row) {
			if r.Stage != StagePanic || r.Code != 500 || r.Reason != "InternalError" {
				t.Errorf("stage %q code %d reason %q", r.Stage, r.Code, r.Reason)
			}
		}},
	}
	d := Decoder{KeepRaw: true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Row
			if err := d.Decode(events[tt.line], &r); err != nil {
				t.Fatal(err)
			}
			if r.Resource != "secrets" && r.Raw != events[tt.line] {
				t.Errorf("raw event of a non-secret changed")
			}
			r.Raw = strings.Clone(r.Raw)
			tt.check(t, &r)
		})
	}
}

func normalize(r *Row) {
	r.Raw = ""
	for _, p := range []*[]string{&r.UserGroups, &r.CauseReasons, &r.CauseFields, &r.AnnotationKeys, &r.AnnotationValues} {
		if len(*p) == 0 {
			*p = nil
		}
	}
}

func TestDecodeRejectsWhatCannotBeARow(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want error
	}{
		{"an event without auditID is rejected", `{"stage":"ResponseComplete","stageTimestamp":"2026-11-29T08:50:48Z"}`, ErrMissingAuditID},
		{"an event without stage is rejected", `{"auditID":"x","stageTimestamp":"2026-11-29T08:50:48Z"}`, ErrMissingStage},
		{"an event without stageTimestamp is rejected", `{"auditID":"x","stage":"Panic"}`, ErrMissingTimestamp},
		{"truncated JSON is rejected", `{"auditID":"x","stage":"Panic","requestObject":{"a":[1,2`, rawjson.ErrEnd},
		{"a bad timestamp is rejected", `{"auditID":"x","stage":"Panic","stageTimestamp":"yesterday"}`, nil},
		{"trailing data is rejected", `{"auditID":"x","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48Z"} {}`, nil},
		{"a JSON array is rejected", `[{"auditID":"x"}]`, nil},
		{"a number where the code belongs is rejected when fractional", `{"auditID":"x","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48Z","responseStatus":{"code":4.5}}`, nil},
		{"a bad escape inside a skipped object is rejected", `{"auditID":"x","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48Z","responseObject":{"a":"\q"}}`, nil},
	}
	var d Decoder
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Row
			err := d.Decode(tt.raw, &r)
			if err == nil {
				t.Fatalf("decoded %+v, want an error", r)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
		})
	}
}

func TestFingerprintSeparatesReusedAuditIDs(t *testing.T) {
	events := realEvents(t)
	var d Decoder
	var a, b Row
	if err := d.Decode(events[0], &a); err != nil {
		t.Fatal(err)
	}
	// The same event re-serialised with other spacing and key order (as a
	// log file and a webhook batch could) fingerprints the same.
	var m map[string]any
	if err := json.Unmarshal([]byte(events[0]), &m); err != nil {
		t.Fatal(err)
	}
	again, _ := json.MarshalIndent(m, "", "  ")
	if err := d.Decode(string(again), &b); err != nil {
		t.Fatal(err)
	}
	if a.Fingerprint != b.Fingerprint {
		t.Errorf("the same event fingerprints differently: %x %x", a.Fingerprint, b.Fingerprint)
	}
	// Another request that reused the Audit-ID differs.
	other := strings.Replace(events[0], `"stageTimestamp":"2026-11-29T08:50:48.123456Z"`, `"stageTimestamp":"2026-11-29T08:50:48.123457Z"`, 1)
	if err := d.Decode(other, &b); err != nil {
		t.Fatal(err)
	}
	if a.AuditID != b.AuditID || a.Fingerprint == b.Fingerprint {
		t.Errorf("a reused audit ID with another stage time must fingerprint differently")
	}
}

// reference decodes the fields DecodeEvent extracts with encoding/json.
func reference(raw string) (map[string]any, bool) {
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, false
	}
	return m, true
}

func str(m map[string]any, path ...string) string {
	var v any = m
	for _, k := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = mm[k]
	}
	s, _ := v.(string)
	return s
}

// FuzzDecode checks that Decode never panics, that it accepts what
// encoding/json accepts (given the required fields), and that the fields it
// extracts agree with encoding/json's reading of the same bytes.
func FuzzDecode(f *testing.F) {
	for _, e := range realEvents(f) {
		f.Add(e)
	}
	f.Add(`{"auditID":"a\u00e9\ud83d\ude00","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48Z"}`)
	f.Add(`{"auditID":"x","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48+02:00","user":null,"objectRef":null}`)
	f.Fuzz(func(t *testing.T, raw string) {
		d := Decoder{KeepRaw: true}
		var r Row
		err := d.Decode(raw, &r)
		m, ok := reference(raw)
		if !ok {
			return // encoding/json rejects it; ours may be more lenient nowhere that matters
		}
		if err != nil {
			if _, isStr := m["auditID"].(string); !isStr || m["auditID"] == "" {
				return
			}
			if _, isStr := m["stage"].(string); !isStr || m["stage"] == "" {
				return
			}
			ts, isStr := m["stageTimestamp"].(string)
			if _, perr := time.Parse(time.RFC3339Nano, ts); !isStr || perr != nil {
				return
			}
			// Typed fields where encoding/json's map reading is looser than
			// the audit schema.
			if strings.Contains(err.Error(), "expected") || strings.Contains(err.Error(), "number") ||
				strings.Contains(err.Error(), "Timestamp") {
				return
			}
			t.Fatalf("encoding/json accepts %q but Decode fails: %v", raw, err)
		}
		if !utf8.ValidString(raw) || strings.Contains(raw, `\u`) {
			return // replacement-character details differ harmlessly
		}
		for _, c := range []struct{ got, want string }{
			{r.AuditID, str(m, "auditID")}, {r.Stage, str(m, "stage")}, {r.Verb, str(m, "verb")},
			{r.RequestURI, str(m, "requestURI")}, {r.User, str(m, "user", "username")},
			{r.Resource, str(m, "objectRef", "resource")}, {r.Name, str(m, "objectRef", "name")},
			{r.Namespace, str(m, "objectRef", "namespace")}, {r.Stamp, str(m, "objectRef", "resourceVersion")},
			{r.Message, str(m, "responseStatus", "message")}, {r.Reason, str(m, "responseStatus", "reason")},
		} {
			if c.got != c.want {
				t.Fatalf("Decode read %q, encoding/json %q in %q", c.got, c.want, raw)
			}
		}
		if r.Resource == "leases" {
			if want := str(m, "requestObject", "spec", "holderIdentity"); r.LeaseHolder != want {
				t.Fatalf("holder %q, want %q", r.LeaseHolder, want)
			}
		}
		if r.Resource == "secrets" && (m["requestObject"] != nil || m["responseObject"] != nil) {
			var red map[string]any
			if err := json.Unmarshal([]byte(r.Raw), &red); err != nil {
				t.Fatalf("redacted event is not JSON: %v", err)
			}
			if red["requestObject"] != nil || red["responseObject"] != nil {
				t.Fatalf("secret objects survived redaction: %s", r.Raw)
			}
		}
	})
}

// BenchmarkDecode measures decode+flatten of real-shaped RequestResponse
// events (~2 KB, the first line of analytics/testdata/events.jsonl) on one core.
func BenchmarkDecode(b *testing.B) {
	raw := realEvents(b)[0]
	d := Decoder{}
	var r Row
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if err := d.Decode(raw, &r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkSplitAndDecode measures an EventList body of 400 such events
// split as a stream and decoded, per event.
func BenchmarkSplitAndDecode(b *testing.B) {
	events := realEvents(b)
	items := make([]string, 400)
	for i := range items {
		items[i] = events[i%len(events)]
	}
	body := []byte(eventList(items...))
	d := Decoder{}
	var r Row
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		lr := NewListReader(bytes.NewReader(body), 0)
		for {
			it, err := lr.Next()
			if err != nil {
				break
			}
			if err := d.Decode(string(it.Raw), &r); err != nil {
				b.Fatal(err)
			}
		}
		lr.Release()
	}
	b.ReportMetric(float64(b.N*len(items))/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkNextRow is BenchmarkSplitAndDecode in one pass
// (ListReader.NextRow), as the sink reads its bodies.
func BenchmarkNextRow(b *testing.B) {
	events := realEvents(b)
	items := make([]string, 400)
	for i := range items {
		items[i] = events[i%len(events)]
	}
	body := []byte(eventList(items...))
	d := Decoder{}
	var r Row
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		lr := NewListReader(bytes.NewReader(body), 0)
		for {
			it, err := lr.NextRow(&d, &r)
			if err != nil {
				break
			}
			if it.Err != nil {
				b.Fatal(it.Err)
			}
		}
		lr.Release()
	}
	b.ReportMetric(float64(b.N*len(items))/b.Elapsed().Seconds(), "events/s")
}
