package filereport_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/internal/chdb"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/proctest"
)

// BenchmarkReportFromFiles times the two roads from an audit log on disk
// to the report, side by side in each run, each as the processes a user
// starts:
//
//   - file: `auditsink report FILE` (the engine in its own process);
//   - server: `auditsink ingest FILE` into clickhouse-server (18.16, on
//     this machine), then `auditsink report` over the same window.
//
// The log is AUDITSINK_BENCH_EVENTS (default 1,000,000) real-shaped events
// (the recorded ones of analytics/testdata, RequestResponse weighted up,
// about 1.3 KB a line), spread over a day and 200 namespaces.
// AUDITSINK_BENCH_REPORT_FLAGS adds flags to both reports (--history).
// The two reports must print the same JSON. It reports both times, their
// ratio (server / file: above 1, the file road is faster) and the peak
// resident memory of the file report's process and of ingest's.
func BenchmarkReportFromFiles(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("AUDITSINK_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	flags := strings.Fields(os.Getenv("AUDITSINK_BENCH_REPORT_FLAGS"))
	bin := filepath.Join(b.TempDir(), "auditsink")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/auditsink").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	ch := chtest.Start(b)
	path := filepath.Join(b.TempDir(), "audit.log")
	size := writeDay(b, path, n)
	fileEnv := append(os.Environ(), chdb.LibEnv+"="+chdbtest.LibPath())
	run := func(env []string, args ...string) ([]byte, int64, time.Duration) {
		b.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		start := time.Now()
		peak, err := proctest.Run(cmd)
		if err != nil {
			b.Fatalf("auditsink %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out.Bytes(), peak, time.Since(start)
	}
	var fileSecs, serverSecs float64
	var filePeak, ingestPeak int64
	for b.Loop() {
		args := append([]string{"report", "--cluster", "bench", "--format", "json", "--no-progress"}, flags...)
		fromFile, peak, d := run(fileEnv, append(args, path)...)
		fileSecs += d.Seconds()
		filePeak = max(filePeak, peak)
		var r report.Report
		if err := json.Unmarshal(fromFile, &r); err != nil {
			b.Fatal(err)
		}

		db := ch.NewDatabase(b)
		serverEnv := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
		_, peak, d1 := run(serverEnv, "ingest", "--database", db, "--cluster", "bench", "--no-progress", path)
		ingestPeak = max(ingestPeak, peak)
		fromServer, _, d2 := run(serverEnv, append(args, "--database", db, "--since", r.Window.Since, "--until", r.Window.Until)...)
		serverSecs += (d1 + d2).Seconds()
		if !bytes.Equal(fromFile, fromServer) {
			b.Fatalf("the reports differ: from the file\n%.2000s\nfrom the server\n%.2000s", fromFile, fromServer)
		}
		if r.Totals.Requests == 0 {
			b.Fatal("the report counts no request")
		}
	}
	runs := float64(b.N)
	b.ReportMetric(fileSecs/runs, "file-s")
	b.ReportMetric(serverSecs/runs, "ingest+report-s")
	b.ReportMetric(serverSecs/fileSecs, "ratio")
	b.ReportMetric(float64(n)*runs/fileSecs, "file-events/s")
	b.ReportMetric(float64(filePeak)/(1<<20), "file-peak-RSS-MiB")
	b.ReportMetric(float64(ingestPeak)/(1<<20), "ingest-peak-RSS-MiB")
	b.ReportMetric(float64(size)/float64(n), "bytes/event")
}

var (
	stampRE = regexp.MustCompile(`"(requestReceivedTimestamp|stageTimestamp)":"[^"]*"`)
	idRE    = regexp.MustCompile(`"auditID":"`)
)

// writeDay writes n events to path: audittest.RealShaped's, each with an audit ID of its own, received one
// after the other over a day, in 200 namespaces.
func writeDay(b *testing.B, path string, n int) int64 {
	b.Helper()
	templates := audittest.RealShaped(b)
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	start := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	step := 24 * time.Hour / time.Duration(n)
	for i := range n {
		t := templates[i%len(templates)]
		at := start.Add(time.Duration(i) * step)
		line := idRE.ReplaceAllLiteralString(t, fmt.Sprintf(`"auditID":"b%d-`, i))
		line = stampRE.ReplaceAllStringFunc(line, func(m string) string {
			field := m[1 : strings.Index(m[1:], `"`)+1]
			ts := at
			if field == "stageTimestamp" {
				ts = at.Add(3 * time.Millisecond)
			}
			return `"` + field + `":"` + ts.Format("2006-01-02T15:04:05.000000Z") + `"`
		})
		line = strings.ReplaceAll(line, "team-a", fmt.Sprintf("team-%d", i/len(templates)%200))
		if _, err := w.WriteString(line + "\n"); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}
