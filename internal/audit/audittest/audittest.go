// Package audittest gives tests the real apiserver audit events of
// analytics/testdata/events.jsonl (see DESIGN.md, "What the audit log
// says"), as JSON lines and as decoded rows.
package audittest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
)

// HistoryKey is the field history key of Rows.
const HistoryKey = "audittest"

// Events returns the JSON lines of analytics/testdata/events.jsonl.
func Events(tb testing.TB) []string {
	tb.Helper()
	_, here, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("audittest: cannot locate analytics/testdata")
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "analytics", "testdata", "events.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// RealShaped returns Events weighted as the benchmarks generate logs:
// the larger RequestResponse and Request events repeated, so that a line
// averages about 1.3 KB (sizes 0.5-2 KB; a tenth at Metadata level, one
// in sixteen a stage that is not stored).
func RealShaped(tb testing.TB) []string {
	ev := Events(tb)
	return append(ev, ev[0], ev[1], ev[5], ev[6], ev[0], ev[1], ev[0])
}

// Rows decodes lines (raw JSON kept, field histories under the key
// HistoryKey) into rows of cluster.
func Rows(tb testing.TB, cluster string, lines []string) []audit.Row {
	tb.Helper()
	h := audit.NewFieldHasher([]byte(HistoryKey))
	d := audit.Decoder{KeepRaw: true, History: &h}
	rows := make([]audit.Row, len(lines))
	for i, l := range lines {
		if err := d.Decode(l, &rows[i]); err != nil {
			tb.Fatal(err)
		}
		rows[i].Cluster = cluster
	}
	return rows
}
