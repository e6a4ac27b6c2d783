package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/test/chdbtest"
)

// fileReportEqualsServer requires `auditsink report FILE...` (the events
// stored in the engine in its own process, reported by the same
// statements) to print, byte for byte, the JSON that `auditsink report`
// prints from the server the same log was ingested into: for several
// windows and each filter; for the log cut into two overlapping rotated
// copies (one gzipped, one with two lines that are no events) given in
// any order with the whole log twice; for the files' own span; and from
// a kept directory that reads only the file added since. server runs
// `auditsink report` on the server with args.
func fileReportEqualsServer(t *testing.T, bin string, lines []string, since, until time.Time, want *report.Report, server func(t *testing.T, args ...string) []byte) {
	dir := t.TempDir()
	whole := filepath.Join(dir, "audit.log")
	writeLines(t, whole, lines, false)
	// Rotated copies that overlap by a third of the log.
	n := len(lines)
	older, newer := filepath.Join(dir, "audit-2026-12-01T00-00-00.000.log"), filepath.Join(dir, "audit-2026-12-02T00-00-00.000.log.gz")
	// The older copy holds a line cut short and one that is no JSON: the
	// report leaves them out, as ingest does.
	writeLines(t, older, append([]string{`{"kind":"Event","apiVersion":"audit.k8s.io/v1","auditID":"cut`, "not json"}, lines[:2*n/3]...), false)
	writeLines(t, newer, lines[n/3:], true)

	fileRun := func(t *testing.T, args ...string) []byte {
		t.Helper()
		return auditsinkRunner(t, bin, chdbtest.LibEnv+"="+chdbtest.LibPath(), "AUDITSINK_CLICKHOUSE_DSN=")(args...)
	}
	common := []string{"--cluster", "e2e", "--format", "json", "--top", "1000", "--history"}
	window := func(a, b time.Time) []string {
		return []string{"--since", a.UTC().Format(time.RFC3339Nano), "--until", b.UTC().Format(time.RFC3339Nano)}
	}
	// same compares the reports for args; fileOnly are flags of the
	// report from files.
	same := func(t *testing.T, args, fileOnly []string, files ...string) []byte {
		t.Helper()
		want := server(t, append(common, args...)...)
		got := fileRun(t, append(append(append([]string{"report"}, append(common, args...)...), fileOnly...), files...)...)
		if !bytes.Equal(got, want) {
			t.Fatalf("auditsink report %s %s differs from the server's report\n%s", strings.Join(args, " "), strings.Join(files, " "), lineDiff(string(want), string(got)))
		}
		return got
	}

	mid := since.Add(until.Sub(since) / 2)
	full := window(since, until)
	cases := map[string][]string{
		"the whole window": full,
		"its first half":   window(since, mid),
		"its second half":  window(mid, until),
	}
	if len(want.HotObjects) == 0 || len(want.RetryLoops) == 0 {
		t.Fatal("the ground truth has no hot object or no retry loop to filter on")
	}
	cases["--namespace"] = append(full, "--namespace", want.HotObjects[0].Namespace)
	cases["--resource"] = append(full, "--resource", want.HotObjects[0].Resource)
	cases["--user"] = append(full, "--user", want.RetryLoops[0].User)
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			var r report.Report
			if err := json.Unmarshal(same(t, args, nil, whole), &r); err != nil {
				t.Fatal(err)
			}
			if r.Totals.Requests == 0 {
				t.Fatalf("the window %v holds no request: the comparison proves little", args)
			}
		})
	}
	t.Run("rotated overlapping copies and a file given twice count once", func(t *testing.T) {
		same(t, full, nil, newer, older, whole, whole)
	})
	t.Run("the files' span is the default window", func(t *testing.T) {
		got := fileRun(t, append(append([]string{"report"}, common...), whole)...)
		var r, wide report.Report
		if err := json.Unmarshal(got, &r); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(server(t, append(common, window(since.Add(-time.Hour), until.Add(time.Hour))...)...), &wide); err != nil {
			t.Fatal(err)
		}
		if r.Totals != wide.Totals {
			t.Fatalf("the default window %+v holds %+v, the log %+v", r.Window, r.Totals, wide.Totals)
		}
		a, err1 := time.Parse(report.TimeFormat, r.Window.Since)
		b, err2 := time.Parse(report.TimeFormat, r.Window.Until)
		if err1 != nil || err2 != nil {
			t.Fatalf("the default window %+v: %v, %v", r.Window, err1, err2)
		}
		same(t, window(a, b), nil, whole)
	})
	t.Run("a kept directory reads what was added, and starts over for fewer files", func(t *testing.T) {
		keep := []string{"--keep", filepath.Join(t.TempDir(), "kept")}
		fresh := func(files ...string) []byte {
			return fileRun(t, append(append(append([]string{"report"}, common...), full...), files...)...)
		}
		kept := func(files ...string) []byte {
			return fileRun(t, append(append(append(append([]string{"report"}, common...), full...), keep...), files...)...)
		}
		if got, want := kept(older), fresh(older); !bytes.Equal(got, want) {
			t.Fatalf("kept, the older copy: %s", lineDiff(string(want), string(got)))
		}
		same(t, full, keep, older, newer)
		same(t, full, keep, older, newer)
		if got, want := kept(newer), fresh(newer); !bytes.Equal(got, want) {
			t.Fatalf("kept, then only the newer copy: %s", lineDiff(string(want), string(got)))
		}
	})
}

func writeLines(t *testing.T, path string, lines []string, gz bool) {
	t.Helper()
	data := []byte(strings.Join(lines, "\n") + "\n")
	if gz {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write(data)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		data = b.Bytes()
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
