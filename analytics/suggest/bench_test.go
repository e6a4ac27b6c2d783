package suggest_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/internal/chdb"
	"github.com/stampguard/stampguard/test/chdbtest"
)

// BenchmarkSuggestCommand runs, side by side in each round, the built
// `auditsink suggest FILE` (the history stored in the engine in process,
// the drafts built, then replayed over the file) and the built `webhook
// replay` of those very drafts over the same file, each pinned to one
// core (taskset -c 0), over the replay benchmark's log of
// SUGGEST_BENCH_EVENTS (default 1,000,000) RequestResponse writes
// (audittest.WriteWrites). It reports each one's events per second of
// wall time and of CPU time (every thread of the process, the engine's
// too), their ratio, and the peak RSS of suggest.
func BenchmarkSuggestCommand(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("SUGGEST_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		b.Fatalf("taskset pins each command to one core: %v", err)
	}
	dir := b.TempDir()
	bins := map[string]string{}
	for _, c := range []string{"auditsink", "webhook"} {
		bins[c] = filepath.Join(dir, c)
		build := exec.Command("go", "build", "-o", bins[c], "./cmd/"+c)
		build.Dir = "../.."
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("go build ./cmd/%s: %v\n%s", c, err, out)
		}
	}
	log := filepath.Join(dir, "audit.log")
	size := audittest.WriteWrites(b, log, n)
	b.Logf("%d events, %d bytes (%.0f bytes per event)", n, size, float64(size)/float64(n))
	drafts := filepath.Join(dir, "drafts.yaml")
	type tally struct {
		wall, cpu time.Duration
		rss       int64
	}
	run := func(t *tally, args ...string) []byte {
		b.Helper()
		cmd := exec.Command(taskset, append([]string{"-c", "0"}, args...)...)
		cmd.Env = append(os.Environ(), chdb.LibEnv+"="+chdbtest.LibPath())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		t.wall += time.Since(start)
		if err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		t.cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		t.rss = max(t.rss, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss*1024)
		return out
	}
	var sg, rp tally
	rounds := 0
	for b.Loop() {
		out := run(&sg, bins["auditsink"], "suggest", "--no-progress", log)
		if !bytes.Contains(out, []byte("kind: ConcurrencyPolicy")) {
			b.Fatalf("suggest drafted nothing:\n%s", out)
		}
		if err := os.WriteFile(drafts, out, 0o600); err != nil {
			b.Fatal(err)
		}
		if rep := run(&rp, bins["webhook"], "replay", "--policy-file", drafts, "--format", "json", log); len(rep) == 0 {
			b.Fatal("no replay report")
		}
		rounds++
	}
	events := float64(n * rounds)
	b.ReportMetric(events/sg.wall.Seconds(), "suggest-events/s")
	b.ReportMetric(events/sg.cpu.Seconds(), "suggest-events/cpu-s")
	b.ReportMetric(events/rp.wall.Seconds(), "replay-events/s")
	b.ReportMetric(events/rp.cpu.Seconds(), "replay-events/cpu-s")
	b.ReportMetric(sg.wall.Seconds()/rp.wall.Seconds(), "suggest/replay")
	b.ReportMetric(float64(sg.rss)/(1<<20), "suggest-peak-RSS-MiB")
}
