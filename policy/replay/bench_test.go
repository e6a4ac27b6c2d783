package replay

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// benchPolicies guard configmaps (a stamp) and deployments (a stamp, the
// replicas' owner, an immutable label) in every namespace.
const benchPolicies = `apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: configmaps}
spec:
  match: {resources: [{resource: configmaps}]}
  requireResourceVersion: true
---
apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: deployments}
spec:
  match: {resources: [{group: apps, resource: deployments}]}
  requireResourceVersion: true
  fieldOwners:
  - path: spec.replicas
    writers: {serviceAccounts: [kube-system/horizontal-pod-autoscaler]}
  immutableFields:
  - path: metadata.labels["team"]
`

// BenchmarkReplayCommand runs the built `webhook replay --format json` on
// one core (GOMAXPROCS=1) over a generated audit log of 200,000 events, or
// REPLAY_BENCH_EVENTS, and reports events per second of wall time and of
// CPU time, and the process's peak RSS. The log is generated once, before
// the clock starts.
func BenchmarkReplayCommand(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("REPLAY_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	dir := b.TempDir()
	bin := filepath.Join(dir, "webhook")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/webhook: %v\n%s", err, out)
	}
	policies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(policies, []byte(benchPolicies), 0o600); err != nil {
		b.Fatal(err)
	}
	logPath := filepath.Join(dir, "audit.log")
	size := audittest.WriteWrites(b, logPath, n)
	b.Logf("%d events, %d bytes (%.0f bytes per event)", n, size, float64(size)/float64(n))
	var wall, cpu time.Duration
	var rss int64
	runs := 0
	for b.Loop() {
		cmd := exec.Command(bin, "replay", "--policy-file", policies, "--format", "json", logPath)
		cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
		start := time.Now()
		out, err := cmd.Output()
		wall += time.Since(start)
		if err != nil {
			b.Fatalf("webhook replay: %v", err)
		}
		if len(out) == 0 {
			b.Fatal("no report")
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		rss = max(rss, ru.Maxrss*1024)
		runs++
	}
	b.ReportMetric(float64(n*runs)/wall.Seconds(), "events/s")
	b.ReportMetric(float64(n*runs)/cpu.Seconds(), "events/cpu-s")
	b.ReportMetric(float64(rss)/(1<<20), "peak-RSS-MiB")
}

// BenchmarkReplayEvent is one event through the library: decode, evaluate,
// count.
func BenchmarkReplayEvent(b *testing.B) {
	var lines [][]byte
	for _, l := range audittest.Writes(b, 50_000) {
		lines = append(lines, []byte(l))
	}
	r, err := New(Options{Policies: testSetFrom(b, benchPolicies)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := r.Event(lines[i%len(lines)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
