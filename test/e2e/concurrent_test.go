package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

// concurrentWriters stores the audit log at logPath, a snapshot of it, by
// concurrent writers into fresh databases, and requires the report of each
// (reportJSON) to equal want as a whole:
//   - two and three `auditsink ingest` processes started at the same moment
//     on overlapping files (the whole log; its first two thirds; its last
//     two thirds, in either order);
//   - two `auditsink serve` processes receiving every webhook batch at the
//     same moment, in two rounds.
//
// The writers store copies of each other's events; the report must be
// exact, and the test logs how many copies events holds.
func concurrentWriters(t *testing.T, bin string, ch *chtest.Server, logPath string, reportJSON func(db string) []byte, want []byte) {
	lines := completeLines(t, logPath)
	dir := t.TempDir()
	write := func(name string, ls []string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(ls, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	third := len(lines) / 3
	whole, head, tail := write("audit.log", lines), write("head.log", lines[:2*third]), write("tail.log", lines[third:])
	env := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("auditsink %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	check := func(t *testing.T, db string) {
		t.Helper()
		var got report.Report
		out := reportJSON(db)
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("report is not the JSON contract: %v\n%s", err, out)
		}
		gotJSON, _ := json.MarshalIndent(got, "", "  ")
		if !bytes.Equal(gotJSON, want) {
			t.Fatalf("the report differs from the ground truth\n%s", lineDiff(string(want), string(gotJSON)))
		}
		var rows, events uint64
		if err := ch.Conn(t, db).QueryRow(t.Context(), "SELECT count(), uniqExact(cluster, audit_id, stage, fingerprint) FROM events_by_hour").Scan(&rows, &events); err != nil {
			t.Fatal(err)
		}
		t.Logf("database %s: %d rows for %d events", db, rows, events)
	}

	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d ingest processes at once", n), func(t *testing.T) {
			db := ch.NewDatabase(t)
			run("migrate", "--database", db)
			files := [][]string{{whole}, {head, tail}, {tail, head}}[:n]
			cmds := make([]*exec.Cmd, n)
			outs := make([]bytes.Buffer, n)
			for i := range cmds {
				cmds[i] = exec.CommandContext(t.Context(), bin, append([]string{"ingest", "--database", db, "--cluster", "e2e", "--no-progress"}, files[i]...)...)
				cmds[i].Env, cmds[i].Stdout, cmds[i].Stderr = env, &outs[i], &outs[i]
			}
			for _, c := range cmds {
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
			}
			for i, c := range cmds {
				if err := c.Wait(); err != nil {
					t.Fatalf("ingest %d: %v\n%s", i, err, outs[i].String())
				}
				t.Logf("ingest %d: %s", i, strings.TrimSpace(outs[i].String()))
			}
			check(t, db)
		})
	}

	t.Run("2 serve processes receiving the same batches", func(t *testing.T) {
		db := ch.NewDatabase(t)
		run("migrate", "--database", db)
		type server struct{ url, metrics string }
		var servers []server
		for i := range 2 {
			addr, metrics := freeAddr(t), freeAddr(t)
			p := &sinkProcess{t: t, bin: bin, args: []string{"serve", "--listen", addr, "--plaintext", "--allow-unauthenticated",
				"--spool-dir", filepath.Join(dir, fmt.Sprintf("spool-%d", i)), "--metrics-listen", metrics, "--database", db,
				"--log-level", "warn"}, env: env, log: filepath.Join(dir, fmt.Sprintf("serve-%d.log", i))}
			p.startPlain(metrics)
			t.Cleanup(p.kill)
			servers = append(servers, server{"http://" + addr + "/clusters/e2e/events", metrics})
		}
		bodies, accepted := eventLists(t, lines, 100)
		const rounds = 2
		for range rounds {
			for _, body := range bodies {
				var wg sync.WaitGroup
				start := make(chan struct{})
				for _, s := range servers {
					wg.Go(func() {
						<-start
						resp, err := http.Post(s.url, "application/json", bytes.NewReader(body))
						if err != nil {
							t.Error(err)
							return
						}
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							t.Errorf("POST %s: %s", s.url, resp.Status)
						}
					})
				}
				close(start)
				wg.Wait()
			}
		}
		for _, s := range servers {
			eventuallyTrue(t, "serve stored or dropped every received event", func() bool {
				return sinkWritten(t, s.metrics) == float64(rounds*accepted)
			})
		}
		check(t, db)
	})
}

// startPlain starts a plain-HTTP serve process, ready when its metrics
// endpoint answers.
func (s *sinkProcess) startPlain(metrics string) {
	s.t.Helper()
	s.launch("answer on "+metrics, func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
}

// completeLines are the newline-terminated lines of a log file.
func completeLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// eventLists groups the lines into webhook batches (audit EventList bodies)
// of up to n events, and counts the events of the stages a sink stores.
func eventLists(t *testing.T, lines []string, n int) ([][]byte, int) {
	t.Helper()
	var bodies [][]byte
	accepted := 0
	for i := 0; i < len(lines); i += n {
		part := lines[i:min(i+n, len(lines))]
		for _, l := range part {
			var ev struct {
				Stage string `json:"stage"`
			}
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatal(err)
			}
			if ev.Stage == audit.StageResponseComplete || ev.Stage == audit.StagePanic {
				accepted++
			}
		}
		bodies = append(bodies, []byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[`+strings.Join(part, ",")+`]}`))
	}
	return bodies, accepted
}
