package replay

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// TestReplayReadsEventsAsTheSinkDoes feeds the same events to the audit
// sink's path (an EventList body as the apiserver's webhook posts it, split
// and decoded in one pass) and to replay's (one line of a log file), and
// requires the same reading of every field: one event means one thing in
// both halves.
func TestReplayReadsEventsAsTheSinkDoes(t *testing.T) {
	const ts = `"stageTimestamp":"2026-11-29T08:50:48.123456Z"`
	odd := func(extra string) string {
		return `{"auditID":"a-1","stage":"ResponseComplete","level":"RequestResponse",` + ts + extra + `}`
	}
	events := append(audittest.Events(t),
		odd(`,"verb":"update","requestURI":"/api/v1/namespaces/a/configmaps/b?dryRun=&fieldManager=m"`),
		odd(`,"verb":"patch","requestURI":"/api/v1/namespaces/a/configmaps/b?fieldManager=first&fieldManager=second&dryRun"`),
		odd(`,"verb":"update","requestURI":"/x?fieldManager=a%zz&dryRun=All"`),
		odd(`,"user":{"username":"admin","groups":["system:masters"]},"impersonatedUser":{"username":"alice","groups":["devs"]}`),
		odd(`,"user":{"username":"admin","groups":["system:masters"]},"impersonatedUser":{"groups":["devs"]}`),
		odd(`,"requestObject": {"metadata":{"resourceVersion":"7"}} ,"responseObject":null`),
		odd(`,"annotations":{"authorization.k8s.io/decision":"forbid","x.stampguard.io/decision":"p/r/Deny"}`),
		odd(`,"responseStatus":{"code":422,"message":"admission webhook \"fields.stampguard.io\" denied the request: no"}`),
	)
	for i, e := range events {
		body := `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[` + e + `]}`
		items := audit.NewListReader(strings.NewReader(body), 1<<20)
		var sink audit.Row
		it, err := audit.NextRow(items, &audit.Decoder{}, &sink)
		if err != nil {
			t.Fatalf("event %d: the sink's reader: %v", i, err)
		}
		if _, err := items.Next(); !errors.Is(err, io.EOF) {
			t.Fatalf("event %d: more than one item: %v", i, err)
		}
		var ev event
		perr := parseEvent([]byte(e), &ev)
		if (it.Err == nil) != (perr == nil) {
			t.Errorf("event %d: the sink reads it with error %v, replay with %v", i, it.Err, perr)
			continue
		}
		if it.Err != nil {
			continue
		}
		if !reflect.DeepEqual(normal(sink), normal(ev.Row)) {
			t.Errorf("event %d: the sink reads\n%+v\nreplay reads\n%+v", i, sink, ev.Row)
		}
		// What replay derives from the row.
		if ev.user.Name != sink.Writer() || !reflect.DeepEqual(ev.user.Groups, sink.WriterGroups()) {
			t.Errorf("event %d: replay's writer %+v, the sink's %q %q", i, ev.user, sink.Writer(), sink.WriterGroups())
		}
		if !bytes.Equal(ev.reqObj, []byte(sink.RequestObject)) || !bytes.Equal(ev.respObj, []byte(sink.ResponseObject)) {
			t.Errorf("event %d: replay's objects differ from the sink's", i)
		}
		if ev.time.UnixMicro() != sink.StageMicros {
			t.Errorf("event %d: replay's time %v, the sink's %d µs", i, ev.time, sink.StageMicros)
		}
		if ev.authzForbid != (sink.AuthzDecision == "forbid") {
			t.Errorf("event %d: authorization decision read differently", i)
		}
	}
}

// normal empties the nil-or-empty difference of reused slices.
func normal(r audit.Row) audit.Row {
	for _, s := range []*[]string{&r.UserGroups, &r.ImpersonatedGroups, &r.CauseReasons, &r.CauseFields, &r.AnnotationKeys, &r.AnnotationValues} {
		if len(*s) == 0 {
			*s = nil
		}
	}
	return r
}
