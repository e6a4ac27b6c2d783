package sink

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/chtest"
)

// BenchmarkTailLag runs `auditsink tail` as its own process on a file that
// grows at 10,000 events/s (a chunk of 500 ingest-shaped events every 50
// ms, for 20 s per run) and reports the lag: for each chunk, the time from
// its write to the moment ClickHouse holds every stored event of it (polled
// every 20 ms), p50 and max.
func BenchmarkTailLag(b *testing.B) {
	const (
		rate  = 10_000
		chunk = 500
		span  = 20 * time.Second
	)
	bin := buildSink(b)
	ch := chtest.Start(b)
	templates := audittest.RealShaped(b)
	// prefix[m] is the stored events among the first m templates.
	prefix := make([]int, len(templates)+1)
	for i, t := range templates {
		prefix[i+1] = prefix[i]
		if !strings.Contains(t, `"stage":"RequestReceived"`) {
			prefix[i+1]++
		}
	}
	var lags []time.Duration
	for run := 0; b.Loop(); run++ {
		b.StopTimer()
		dir := b.TempDir()
		path := filepath.Join(dir, "audit.log")
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			b.Fatal(err)
		}
		db := ch.NewDatabase(b)
		env := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
		mig := exec.Command(bin, "migrate", "--database", db, "--compact=false")
		mig.Env = env
		if out, err := mig.CombinedOutput(); err != nil {
			b.Fatalf("migrate: %v\n%s", err, out)
		}
		cmd := exec.Command(bin, "tail", "--database", db, "--cluster", "bench", "--log-level", "warn", path)
		cmd.Env = env
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			b.Fatal(err)
		}
		conn := ch.Conn(b, db)
		b.StartTimer()
		var written []time.Time           // when chunk i was written
		wantAfter := func(i int) uint64 { // stored events in chunks 0..i
			lines := (i + 1) * chunk
			return uint64(lines/len(templates)*prefix[len(templates)] + prefix[lines%len(templates)])
		}
		start := time.Now()
		next, seen := 0, 0
		for i := 0; time.Since(start) < span || seen < len(written); {
			if time.Since(start) < span && time.Until(start.Add(time.Duration(i)*chunk*time.Second/rate)) <= 0 {
				var sb strings.Builder
				for j := range chunk {
					t := templates[(i*chunk+j)%len(templates)]
					k := strings.Index(t, `"auditID":"`) + len(`"auditID":"`)
					fmt.Fprintf(&sb, "%sr%d-c%d-j%d-%s\n", t[:k], run, i, j, t[k:])
				}
				if _, err := f.WriteString(sb.String()); err != nil {
					b.Fatal(err)
				}
				written = append(written, time.Now())
				i++
				continue
			}
			if next++; next%4 == 0 || time.Since(start) >= span {
				var n uint64
				if err := conn.QueryRow(context.Background(), "SELECT count() FROM events_by_hour").Scan(&n); err != nil {
					b.Fatal(err)
				}
				for seen < len(written) && n >= wantAfter(seen) {
					lags = append(lags, time.Since(written[seen]))
					seen++
				}
				if time.Since(start) > span+time.Minute {
					b.Fatalf("tail fell behind: %d of %d chunks stored\n%s", seen, len(written), out.String())
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		b.StopTimer()
		f.Close()
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait() // interrupted on purpose
		b.StartTimer()
	}
	slices.Sort(lags)
	b.ReportMetric(float64(lags[len(lags)/2].Milliseconds()), "p50-lag-ms")
	b.ReportMetric(float64(lags[len(lags)-1].Milliseconds()), "max-lag-ms")
}
