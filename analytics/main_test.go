package analytics

import (
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/internal/chdbtest"
	"github.com/stampguard/stampguard/internal/chtest"
)

// realEvents returns the JSON lines of testdata/events.jsonl, real
// apiserver event shapes (see DESIGN.md, "What the audit log says").
func realEvents(tb testing.TB) []string {
	tb.Helper()
	b, err := os.ReadFile("testdata/events.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// eventList wraps events in an audit.k8s.io/v1 EventList.
func eventList(events ...string) string {
	return `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`
}

// normalize drops what a stored row does not keep (Raw) and makes empty
// lists nil, so that rows compare with reflect.DeepEqual.
func normalize(r *audit.Row) {
	r.Raw = ""
	for _, p := range []*[]string{&r.UserGroups, &r.CauseReasons, &r.CauseFields, &r.AnnotationKeys, &r.AnnotationValues} {
		if len(*p) == 0 {
			*p = nil
		}
	}
}

// micros is the Unix microseconds of an RFC 3339 time.
func micros(s string) int64 {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UnixMicro()
}

var tempDirs []string

func mkTemp() string {
	d, err := os.MkdirTemp("", "analytics-ch-")
	if err != nil {
		panic(err)
	}
	tempDirs = append(tempDirs, d)
	return d
}

func TestMain(m *testing.M) {
	code := chdbtest.Run(m)
	for i := len(processCleanups) - 1; i >= 0; i-- {
		processCleanups[i]()
	}
	for _, d := range tempDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

func testutilValue(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func chtestStart(tb testing.TB) *chtest.Server { return chtest.Start(tb) }
