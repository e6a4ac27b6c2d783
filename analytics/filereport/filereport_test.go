package filereport

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/internal/chdb"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/testenv"
)

func testdata(t *testing.T) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "testdata", "events.jsonl")
}

// Run in this process, twice on one kept directory: the second reads
// nothing and reports the same.
func TestRunKeptTwice(t *testing.T) {
	testenv.SkipIfShort(t, "loads ClickHouse 26.7 (chDB)")
	keep := filepath.Join(t.TempDir(), "kept")
	o := Options{Files: []string{testdata(t)}, Lib: chdbtest.LibPath(), Keep: keep, Cluster: "c", Report: report.Options{History: true, Top: 100}}
	first, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if first.Ingest.Stored == 0 || len(first.Reused) != 0 || first.Report.Totals.Requests == 0 {
		t.Fatalf("first run: %+v, reused %v, totals %+v", first.Ingest, first.Reused, first.Report.Totals)
	}
	second, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if second.Ingest.Stored != 0 || len(second.Reused) != 1 || second.Report.Totals != first.Report.Totals {
		t.Fatalf("second run stored %d, reused %v, totals %+v; want nothing stored, the file reused, totals %+v",
			second.Ingest.Stored, second.Reused, second.Report.Totals, first.Report.Totals)
	}
}

func TestRunSaysWhatIsMissing(t *testing.T) {
	if _, err := Run(t.Context(), Options{}); err == nil || !strings.Contains(err.Error(), "no audit log file") {
		t.Errorf("no file: %v", err)
	}
	_, err := Run(t.Context(), Options{Files: []string{testdata(t)}, Lib: filepath.Join(t.TempDir(), "libchdb.so")})
	if err == nil || !strings.Contains(err.Error(), "npm pack "+chdb.NPMPackage) {
		t.Errorf("a missing library: %v, want how to get it", err)
	}
}
