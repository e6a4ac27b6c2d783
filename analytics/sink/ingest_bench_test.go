package sink

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/proctest"
)

// BenchmarkIngest runs `auditsink ingest` as its own process on one plain
// JSON-lines file of generated real-shaped events (AUDITSINK_BENCH_EVENTS,
// default 200,000) into a fresh database, and in the same run the ceiling:
// clickhouse-client inserting the same flattened rows as TabSeparated into
// the same schema. It reports both rates, their ratio, and the ingest
// process's peak RSS and CPU per event, and ClickHouse's CPU per event for
// both (figures that a busy machine moves less than the rates).
// AUDITSINK_BENCH_INGEST_FLAGS adds flags to ingest (--no-field-history:
// the cost of the field history, side by side); AUDITSINK_BENCH_MIX=writes
// sends only writes logged with their responses (mixTemplates).
func BenchmarkIngest(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("AUDITSINK_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	bin := buildSink(b)
	ch := chtest.Start(b)
	templates := mixTemplates(b, audittest.RealShaped(b))
	dir := b.TempDir()
	var (
		events, secs, ceilSecs, cpu float64
		chCPU, ceilCHCPU            float64
		rss                         int64
		size                        int64
		run                         int
	)
	for b.Loop() {
		run++
		b.StopTimer()
		path := filepath.Join(dir, "audit.log")
		lines, bodies := ingestFile(templates, run, n)
		if err := os.WriteFile(path, lines, 0o644); err != nil {
			b.Fatal(err)
		}
		size = int64(len(lines))
		db := ch.NewDatabase(b)
		env := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
		mig := exec.Command(bin, "migrate", "--database", db, "--compact=false")
		mig.Env = env
		if out, err := mig.CombinedOutput(); err != nil {
			b.Fatalf("migrate: %v\n%s", err, out)
		}
		b.StartTimer()
		args := append([]string{"ingest", "--database", db, "--cluster", "bench", "--no-progress"}, strings.Fields(os.Getenv("AUDITSINK_BENCH_INGEST_FLAGS"))...)
		cmd := exec.Command(bin, append(args, path)...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start, ch0 := time.Now(), proctest.CPUSeconds(ch.PID())
		peak, err := proctest.Run(cmd)
		if err != nil {
			b.Fatalf("ingest: %v\n%s", err, out.String())
		}
		secs += time.Since(start).Seconds()
		rss = max(rss, peak)
		b.StopTimer()
		if os.Getenv("AUDITSINK_BENCH_SHOW") != "" {
			b.Log(out.String())
		}
		stored := 0
		if _, err := fmt.Sscanf(out.String()[strings.Index(out.String(), ": ")+2:], "%d events stored", &stored); err != nil || stored == 0 {
			b.Fatalf("ingest said %q", out.String())
		}
		waitCount(b, ch, db, uint64(stored))
		chCPU += proctest.CPUSeconds(ch.PID()) - ch0
		events += float64(stored)
		cpu += (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
		ch0 = proctest.CPUSeconds(ch.PID())
		ceilSecs += ceiling(b, ch, bodies)
		ceilCHCPU += proctest.CPUSeconds(ch.PID()) - ch0
		b.StartTimer()
	}
	b.ReportMetric(events/secs, "events/s")
	b.ReportMetric(events/ceilSecs, "ceiling-events/s")
	b.ReportMetric(ceilSecs/secs, "ratio")
	b.ReportMetric(float64(rss)/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(1e6*cpu/events, "ingest-cpu-µs/event")
	b.ReportMetric(1e6*chCPU/events, "clickhouse-cpu-µs/event")
	b.ReportMetric(1e6*ceilCHCPU/events, "ceiling-clickhouse-cpu-µs/event")
	b.ReportMetric(float64(size)/float64(n), "bytes/event")
}

// ingestFile generates n events as JSON lines, audit IDs unique per run,
// and the same events as EventList bodies of 400 (for the ceiling).
func ingestFile(templates []string, run, n int) ([]byte, [][]byte) {
	var file bytes.Buffer
	var bodies [][]byte
	var body bytes.Buffer
	for i := range n {
		t := templates[i%len(templates)]
		k := strings.Index(t, `"auditID":"`) + len(`"auditID":"`)
		line := t[:k] + fmt.Sprintf("r%d-i%d-", run, i) + t[k:]
		file.WriteString(line)
		file.WriteByte('\n')
		if i%400 == 0 {
			if body.Len() > 0 {
				body.WriteString("]}")
				bodies = append(bodies, bytes.Clone(body.Bytes()))
				body.Reset()
			}
			body.WriteString(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[`)
		} else {
			body.WriteByte(',')
		}
		body.WriteString(line)
	}
	body.WriteString("]}")
	bodies = append(bodies, body.Bytes())
	return file.Bytes(), bodies
}
