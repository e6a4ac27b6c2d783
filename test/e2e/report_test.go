package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/analytics/store/enginetest"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
)

// TestReportEqualsGroundTruth runs the scripted workload against a real
// apiserver, feeds its audit log (stampguard's decisions annotated, so
// that every section is nonzero: annotatedWorkload) through `auditsink
// ingest` into a real ClickHouse, and requires `auditsink report --format
// json` to equal, as a whole, the report computed from what the clients
// saw.
func TestReportEqualsGroundTruth(t *testing.T) {
	ch := chtest.Start(t)
	db := ch.NewDatabase(t)
	gt := sharedGroundTruth(t) // every section of the report nonzero
	res, want := gt.res, gt.want
	auditLog := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(auditLog, []byte(strings.Join(gt.lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	bin := buildAuditsink(t, kubetest.RepoRoot(t), t.TempDir())
	dsn := ch.DSN()
	// dsn is read at each call: a subtest turns on query logging.
	sink := func(args ...string) []byte {
		t.Helper()
		return auditsinkRunner(t, bin, "AUDITSINK_CLICKHOUSE_DSN="+dsn)(args...)
	}
	ingest := func() { sink("ingest", "--database", db, "--cluster", "e2e", auditLog) }
	reportJSON := func() []byte {
		return sink("report", "--database", db, "--cluster", "e2e", "--format", "json", "--top", "1000", "--history",
			"--since", res.Since.UTC().Format(time.RFC3339Nano), "--until", res.Until.UTC().Format(time.RFC3339Nano))
	}
	ingest()
	got := reportJSON()

	wantJSON := gt.json
	var gotReport report.Report
	if err := json.Unmarshal(got, &gotReport); err != nil {
		t.Fatalf("report is not the JSON contract: %v\n%s", err, got)
	}
	gotJSON, _ := json.MarshalIndent(gotReport, "", "  ")
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Fatalf("the report differs from the ground truth\n%s", lineDiff(string(wantJSON), string(gotJSON)))
	}

	t.Run("ingesting the same log again changes nothing", func(t *testing.T) {
		ingest()
		if again := reportJSON(); !bytes.Equal(again, got) {
			t.Fatalf("report changed after a second ingest\n%s", lineDiff(string(got), string(again)))
		}
	})
	t.Run("concurrent writers count each event once", func(t *testing.T) {
		concurrentWriters(t, bin, ch, auditLog, func(db string) []byte {
			return sink("report", "--database", db, "--cluster", "e2e", "--format", "json", "--top", "1000",
				"--since", res.Since.UTC().Format(time.RFC3339Nano), "--until", res.Until.UTC().Format(time.RFC3339Nano))
		}, wantJSON)
	})
	t.Run("the report from the log file equals the server's", func(t *testing.T) {
		fileReportEqualsServer(t, bin, gt.lines, res.Since, res.Until, &want, func(t *testing.T, args ...string) []byte {
			return auditsinkRunner(t, bin, "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())(append([]string{"report", "--database", db}, args...)...)
		})
	})
	t.Run("the table shows the same findings", func(t *testing.T) {
		table := string(sink("report", "--database", db, "--cluster", "e2e", "--top", "1000",
			"--since", res.Since.UTC().Format(time.RFC3339Nano), "--until", res.Until.UTC().Format(time.RFC3339Nano)))
		for _, l := range want.RetryLoops {
			if !strings.Contains(table, l.User) {
				t.Errorf("table lacks the retry loop of %s", l.User)
			}
		}
		if !strings.Contains(table, "UNRESOLVED RETRY LOOPS") || !strings.Contains(table, "LEASE HOLDER CHANGES") {
			t.Errorf("table lacks its sections:\n%s", table)
		}
	})
	// The real audit log on ClickHouse 26.7 (chDB): the same events, the
	// tables its views fill, and every statement the report sent to 18.16
	// (logged there with its bound parameters) give the same answers.
	t.Run("26.7 answers as 18.16 does", func(t *testing.T) {
		en := enginetest.Attach(t, ch, chdbtest.Open(t), db)
		en.CopyTo26(t)
		rows := en.SameAnswers(t, "", en.Tables(t))
		var stored uint64
		if err := ch.Conn(t, db).QueryRow(t.Context(), "SELECT uniqExact(cluster, audit_id, stage, fingerprint) FROM events_by_hour").Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored == 0 || uint64(rows) < stored {
			t.Errorf("the tables held %d rows, fewer than the %d stored events", rows, stored)
		}
		dsn = ch.DSN() + "&log_queries=1"
		defer func() { dsn = ch.DSN() }()
		reportJSON()
		stmts := en.Recorded(t, "e2e report")
		if len(stmts) < len(report.All) {
			t.Fatalf("the report ran %d statements, fewer than the %d of report.All (with --history)", len(stmts), len(report.All))
		}
		answered := en.SameAnswers(t, "", stmts)
		if answered == 0 {
			t.Error("every report statement answered nothing")
		}
		t.Logf("same on both: %d table rows, %d report statements with %d rows", rows, len(stmts), answered)
	})
	t.Run("an empty window says so plainly", func(t *testing.T) {
		out := string(sink("report", "--database", db, "--cluster", "e2e",
			"--since", res.Since.Add(-2*time.Hour).UTC().Format(time.RFC3339Nano), "--until", res.Since.Add(-time.Hour).UTC().Format(time.RFC3339Nano)))
		if !strings.Contains(out, "No requests were recorded in this window") {
			t.Fatalf("empty window report:\n%s", out)
		}
	})
}

// lineDiff shows the lines of b that differ from a, with context enough to
// find them.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			out.WriteString("line " + itoa(i+1) + ":\n  want " + x + "\n  got  " + y + "\n")
		}
	}
	return out.String()
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
