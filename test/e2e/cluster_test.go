package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"crypto/tls"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/pkitest"
	"github.com/stampguard/stampguard/test/testenv"
	wl "github.com/stampguard/stampguard/test/workload"
)

// TestClusterMode runs stampguard on a ClickHouse cluster as a platform
// team would: two shards of two replicas with ZooKeeper, `auditsink
// migrate --clickhouse-cluster` from two processes at once, and two
// `auditsink serve` replicas behind "one address": every batch of a real
// apiserver's audit log (every report section nonzero: annotatedWorkload)
// goes to one of them at random, some to both. One replica of a shard is
// SIGKILLed while batches flow and left down. The whole JSON report, read
// through the Distributed tables, equals the workload's client-side ground
// truth with the replica down, after it came back, after the hour caches
// are built, and after OPTIMIZE FINAL.
func TestClusterMode(t *testing.T) {
	testenv.SkipIfShort(t, "starts ZooKeeper, four clickhouse-servers, kube-apiserver, etcd and two sinks")
	ctx := t.Context()
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	bin := buildAuditsink(t, root, dir)
	c := chtest.StartCluster(t, 2, 2)
	const db = "stampguard"
	env := []string{"AUDITSINK_CLICKHOUSE_DSN=" + c.DSN(), "AUDITSINK_CLICKHOUSE_CLUSTER=" + chtest.ClusterName}
	sink := auditsinkRunner(t, bin, env...)

	t.Log("migrate from two processes at once")
	var wg sync.WaitGroup
	outs := make([][]byte, 2)
	for i := range outs {
		wg.Go(func() { outs[i] = sink("migrate", "--database", db) })
	}
	wg.Wait()
	for i, out := range outs {
		if !strings.Contains(string(out), "at schema version") {
			t.Fatalf("migrate %d: %s", i, out)
		}
	}
	again := string(sink("migrate", "--database", db))
	if !strings.Contains(again, "applied now: []") {
		t.Errorf("a third migrate applied something: %s", again)
	}

	gt := sharedGroundTruth(t) // every section nonzero, in closed hours
	res, want := gt.res, gt.want

	sinkCA := pkitest.NewCA("e2e-sink-ca")
	certFile, keyFile := sinkCA.Server("auditsink", "127.0.0.1").WriteFiles(t, dir)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("cluster-token-0123456789abcdef0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var sinks []*sinkProcess
	var addrs []string
	for i := range 2 {
		addr := freeAddr(t)
		s := &sinkProcess{t: t, bin: bin, args: []string{"serve", "--listen", addr,
			"--tls-cert", certFile, "--tls-key", keyFile, "--token-file", tokenFile,
			"--spool-dir", filepath.Join(dir, fmt.Sprintf("spool-%d", i)), "--metrics-listen", "",
			"--database", db, "--log-level", "warn"},
			env: append(os.Environ(), env...), log: filepath.Join(dir, fmt.Sprintf("sink-%d.log", i))}
		s.start()
		t.Cleanup(s.kill)
		sinks, addrs = append(sinks, s), append(addrs, addr)
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: sinkCA.Pool()}}}
	post := func(addr string, body []byte) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/clusters/e2e/events", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer cluster-token-0123456789abcdef0123456789")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST to %s: %s", addr, resp.Status)
		}
		return nil
	}
	// deliver retries like the apiserver until a replica answers 200.
	deliver := func(addr string, body []byte) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			err := post(addr, body)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("batch never acknowledged: %v", err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	batches, _ := eventLists(t, gt.lines, 40)
	rnd := rand.New(rand.NewPCG(16, 16))
	down := c.Shards[0][0]
	both := 0
	for i, body := range batches {
		if i == len(batches)/3 {
			t.Log("SIGKILL the first replica of shard 1 while batches flow; it stays down")
			down.Kill()
		}
		if rnd.IntN(4) == 0 {
			// The apiserver retried on the other replica while the first
			// was still storing: the same batch at the same moment.
			both++
			var wg sync.WaitGroup
			for _, a := range addrs {
				wg.Go(func() { deliver(a, body) })
			}
			wg.Wait()
			continue
		}
		deliver(addrs[rnd.IntN(2)], body)
	}
	t.Logf("%d batches, %d of them to both sinks", len(batches), both)

	// Every acknowledged event is stored once the writers drained their
	// spools and the restarted replica caught up.
	wantIDs := map[string]bool{}
	for _, l := range gt.lines {
		var e struct{ AuditID, Stage string }
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		if e.Stage == "ResponseComplete" || e.Stage == "Panic" {
			wantIDs[e.AuditID] = true
		}
	}
	conn := c.Shards[0][1].ClusterConn(t, db)
	eventuallyTrue(t, "every audit ID to be stored in the cluster", func() bool {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT uniqExact(audit_id) FROM events_by_hour WHERE cluster = 'e2e'").Scan(&n); err != nil {
			t.Logf("count stored IDs: %v", err)
			return false
		}
		return int(n) == len(wantIDs)
	})
	for i, s := range sinks {
		if _, err := s.terminate(); err != nil {
			t.Errorf("sink %d exited with %v", i, err)
		}
	}
	hours := want
	hSince, hUntil := res.Since.Truncate(time.Hour), res.Until.Truncate(time.Hour).Add(time.Hour)
	hours.Window = report.Window{Since: hSince.UTC().Format(wl.TimeFormat), Until: hUntil.UTC().Format(wl.TimeFormat)}
	// compare requires the report over the workload's window (cutting
	// hours: raw events) and over the whole hours around it (their
	// caches, once built and clean) to equal the ground truth.
	compare := func(when string) {
		t.Helper()
		for _, w := range []struct {
			since, until time.Time
			want         report.Report
		}{{res.Since, res.Until, want}, {hSince, hUntil, hours}} {
			got := sink("report", "--database", db, "--cluster", "e2e", "--format", "json", "--top", "1000",
				"--since", w.since.UTC().Format(time.RFC3339Nano), "--until", w.until.UTC().Format(time.RFC3339Nano))
			var gotReport report.Report
			if err := json.Unmarshal(got, &gotReport); err != nil {
				t.Fatalf("report is not the JSON contract: %v\n%s", err, got)
			}
			gotJSON, _ := json.MarshalIndent(gotReport, "", "  ")
			wantJSON, _ := json.MarshalIndent(w.want, "", "  ")
			if !bytes.Equal(gotJSON, wantJSON) {
				for i, s := range sinks {
					log, _ := os.ReadFile(s.log)
					t.Logf("sink %d's log:\n%s", i, log)
				}
				t.Fatalf("%s, the cluster's report over %s..%s differs from the ground truth\n%s", when,
					w.since.Format(time.RFC3339), w.until.Format(time.RFC3339), lineDiff(string(wantJSON), string(gotJSON)))
			}
		}
	}
	// Every read takes an event once by its identity: exact as soon as
	// the live replicas hold the events, with the killed one still down;
	// after it came back; after the hour caches are built; and after the
	// copies merge away.
	compare("with a replica down, once every event is stored")
	down.Start()
	if err := down.ClusterConn(t, db).Exec(ctx, "SYSTEM SYNC REPLICA events_by_hour_local"); err != nil {
		t.Fatalf("sync the restarted replica: %v", err)
	}
	compare("after the killed replica came back")
	// The caches, built without the settling time (DefaultCompactAfter)
	// that `auditsink migrate` and serve's loop wait after an hour's last
	// mark: within the test they would build none.
	st, err := store.Open(ctx, store.Options{DSN: c.DSN(), Database: db, ClickHouseCluster: chtest.ClusterName})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	built, err := st.Compact(ctx, time.Unix(0, 0), 0)
	if err != nil {
		t.Fatalf("compact: %v", err)
	}
	if len(built.Hours) == 0 {
		t.Fatal("no hour cache built: the whole-hours report would not read one")
	}
	t.Logf("hour caches built for %v", built.Hours)
	compare("after the hour caches are built")

	// Every hour compacted again a second later (so that the new record
	// is the newest): the first versions are superseded, and Prune
	// deletes them on every node (ALTER ... ON CLUSTER). The report is
	// exact while the deletes run and after.
	time.Sleep(1100 * time.Millisecond)
	for _, h := range built.Hours {
		if err := st.CompactHour(ctx, h); err != nil {
			t.Fatalf("compact %s again: %v", h, err)
		}
	}
	versionsPerHour := func() uint64 {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT max(c) FROM (SELECT hour, uniqExact(version) AS c FROM hour_requests GROUP BY hour)").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := versionsPerHour(); n != 2 {
		t.Fatalf("hour_requests holds up to %d versions of an hour after a second compaction, want 2", n)
	}
	time.Sleep(1100 * time.Millisecond) // past the new records, by the servers' clocks
	pruned, err := st.Prune(ctx, 0)
	if err != nil || pruned != len(built.Hours) {
		t.Fatalf("prune: %d versions, %v; want the %d first ones", pruned, err, len(built.Hours))
	}
	compare("while the superseded cache versions are deleted")
	for _, shard := range c.Shards {
		for _, r := range shard {
			chtest.WaitForMutations(t, r.ClusterConn(t, db), db)
		}
	}
	if n := versionsPerHour(); n != 1 {
		t.Errorf("hour_requests holds up to %d versions of an hour after the prune, want 1", n)
	}
	compare("after the superseded cache versions were deleted")
	// 18.16 cannot run OPTIMIZE ON CLUSTER on replicated tables: each
	// shard's leader merges, and the other replica follows. After the
	// kill, the dead replica's leadership lasts until its ZooKeeper
	// session expires ("Leader was suddenly changed"): retry on either
	// replica until one merges.
	for _, shard := range c.Shards {
		var last error
		eventuallyTrue(t, "a replica of the shard to merge", func() bool {
			for _, r := range shard {
				if last = r.ClusterConn(t, db).Exec(ctx, "OPTIMIZE TABLE events_by_hour_local FINAL"); last == nil {
					return true
				}
			}
			t.Logf("OPTIMIZE: %v", strings.SplitN(last.Error(), "\n", 2)[0])
			time.Sleep(time.Second)
			return false
		})
	}
	compare("after OPTIMIZE FINAL")
}

// auditBatches cuts an audit log into EventList bodies of n events, as the
// apiserver's webhook backend sends them.
func auditBatches(t *testing.T, path string, n int) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	var items [][]byte
	flush := func() {
		if len(items) == 0 {
			return
		}
		body := append([]byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[`), bytes.Join(items, []byte(","))...)
		out = append(out, append(body, "]}"...))
		items = nil
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			items = append(items, append([]byte(nil), line...))
			if len(items) == n {
				flush()
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	return out
}
