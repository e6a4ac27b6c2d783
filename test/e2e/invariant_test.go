package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics/report"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/chtest"
	"github.com/stampguard/stampguard/internal/kubetest"
	"github.com/stampguard/stampguard/internal/testenv"
	wl "github.com/stampguard/stampguard/test/workload"
)

// The policies whose decisions annotatedWorkload writes into the log, in
// the stampguard webhooks' annotation format (policy/admission): an
// Audit-mode requireResourceVersion policy, which records every stampless
// update it lets through, and a Warn-mode field owner, which records every
// successful patch.
const (
	auditStamplessPolicy = "wl-audit-stampless"
	warnOwnerPolicy      = "wl-warn-owners"
)

// workloadDecisions are the stampguard decisions of request r under the
// two policies above, as the report counts them.
func workloadDecisions(r wl.Request) []report.PolicyDecisions {
	var ds []report.PolicyDecisions
	if wl.IsStamplessUpdate(r) {
		ds = append(ds, report.PolicyDecisions{Policy: auditStamplessPolicy, Kind: "stamp-missing", Action: "audit", Count: 1})
	}
	if r.Verb == "patch" && r.Succeeded() {
		ds = append(ds, report.PolicyDecisions{Policy: warnOwnerPolicy, Kind: "field-owner", Action: "warn", Count: 1})
	}
	return ds
}

// decisionAnnotations are the audit annotations the apiserver writes for
// the webhooks' answer carrying ds: the key is the webhook's name and the
// rule kind, the value the JSON array policy/admission writes.
func decisionAnnotations(r wl.Request, ds []report.PolicyDecisions) map[string]string {
	out := map[string]string{}
	for _, d := range ds {
		webhook, rule, path := "stamp.stampguard.dev", "requireResourceVersion", "metadata.resourceVersion"
		if d.Kind != "stamp-missing" {
			webhook, rule, path = "fields.stampguard.dev", "fieldOwners[0]", "spec.replicas"
		}
		entry, _ := json.Marshal(map[string]string{"policy": d.Policy, "rule": rule,
			"action": strings.ToUpper(d.Action[:1]) + d.Action[1:], "path": path, "writer": r.Writer})
		out[webhook+"/"+d.Kind] = "[" + string(entry) + "]"
	}
	return out
}

// groundTruth is a workload's audit log and what its report must say.
type groundTruth struct {
	res   *wl.Result
	lines []string // the audit log, decisions annotated
	want  report.Report
	json  []byte // want, indented as the tests compare it
}

// truthShift moves the workload's events back in time: their hours are
// then closed, and `auditsink migrate` or `ingest` builds their hour
// caches, which a report over whole hours reads when the hour is clean.
const truthShift = 3 * time.Hour

// annotatedWorkload runs the scripted workload on a real apiserver and
// returns its audit log with the stampguard decisions of workloadDecisions
// added to the ResponseComplete events and every timestamp moved back by
// truthShift, and the ground truth: the report computed from what the
// clients saw (moved back the same), its policy_decisions from the same
// decisions. Every section of the report is nonzero in it (checked).
// gt.res's Since and Until are moved back; its requests are as sent.
func annotatedWorkload(t *testing.T) *groundTruth {
	t.Helper()
	env := kubetest.Start(t, wl.KubetestOptions())
	ctx := t.Context()
	res, err := wl.Run(ctx, env)
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	events, err := res.WaitAudited(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := res.TruthAt(events)
	if err != nil {
		t.Fatal(err)
	}
	want.PolicyDecisions = wl.PolicyDecisions(res.Requests, res.Since, res.Until, workloadDecisions)

	annotations := map[string]map[string]string{}
	for _, r := range res.Requests {
		if ds := workloadDecisions(r); len(ds) > 0 {
			annotations[r.AuditID] = decisionAnnotations(r, ds)
		}
	}
	var lines []string
	annotated := 0
	for _, l := range completeLines(t, env.AuditLogPath) {
		var ev struct {
			AuditID     string            `json:"auditID"`
			Stage       string            `json:"stage"`
			Annotations map[string]string `json:"annotations"`
			Received    time.Time         `json:"requestReceivedTimestamp"`
			At          time.Time         `json:"stageTimestamp"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &raw); err != nil {
			t.Fatal(err)
		}
		raw["requestReceivedTimestamp"], _ = json.Marshal(ev.Received.Add(-truthShift).UTC().Format(wl.TimeFormat))
		raw["stageTimestamp"], _ = json.Marshal(ev.At.Add(-truthShift).UTC().Format(wl.TimeFormat))
		if add := annotations[ev.AuditID]; ev.Stage == audit.StageResponseComplete && add != nil {
			if ev.Annotations == nil {
				ev.Annotations = map[string]string{}
			}
			for k, v := range add {
				ev.Annotations[k] = v
			}
			raw["annotations"], _ = json.Marshal(ev.Annotations)
			annotated++
		}
		b, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
	}
	if annotated != len(annotations) {
		t.Fatalf("annotated %d events for the decisions of %d requests", annotated, len(annotations))
	}
	// The times move back with the events.
	shift := func(ts string) string {
		tm, err := time.Parse(wl.TimeFormat, ts)
		if err != nil {
			t.Fatal(err)
		}
		return tm.Add(-truthShift).UTC().Format(wl.TimeFormat)
	}
	want.Window = report.Window{Since: shift(want.Window.Since), Until: shift(want.Window.Until)}
	for i := range want.RetryLoops {
		want.RetryLoops[i].First, want.RetryLoops[i].Last = shift(want.RetryLoops[i].First), shift(want.RetryLoops[i].Last)
	}
	moved := *res
	moved.Since, moved.Until = res.Since.Add(-truthShift), res.Until.Add(-truthShift)
	res = &moved
	requireEverySection(t, want)
	js, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return &groundTruth{res: res, lines: lines, want: want, json: js}
}

// requireEverySection fails unless every section and every total of r is
// nonzero: a comparison with r then proves each of them.
func requireEverySection(t *testing.T, r report.Report) {
	t.Helper()
	tot := r.Totals
	for _, c := range []struct {
		what string
		n    uint64
	}{
		{"requests", tot.Requests}, {"write attempts", tot.WriteAttempts}, {"version conflicts", tot.VersionConflicts},
		{"field conflicts", tot.FieldConflicts}, {"already exists", tot.AlreadyExists},
		{"delete precondition conflicts", tot.DeletePreconditionConflicts}, {"stampless updates", tot.StamplessUpdates},
		{"other conflicts", tot.OtherConflicts}, {"gone", tot.Gone},
		{"conflicts_by_user", uint64(len(r.ConflictsByUser))}, {"conflicts_by_resource", uint64(len(r.ConflictsByResource))},
		{"hot_objects", uint64(len(r.HotObjects))}, {"retry_loops", uint64(len(r.RetryLoops))},
		{"stampless_updates", uint64(len(r.StamplessUpdates))}, {"lease_holder_changes", uint64(len(r.LeaseHolderChanges))},
		{"policy_decisions", uint64(len(r.PolicyDecisions))},
	} {
		if c.n == 0 {
			t.Errorf("the ground truth has no %s: the comparison would not prove them", c.what)
		}
	}
	kinds := map[string]bool{}
	for _, d := range r.PolicyDecisions {
		kinds[d.Kind+"/"+d.Action] = true
	}
	if len(kinds) < 2 {
		t.Errorf("the ground truth's policy decisions are of %d kinds, want 2 or more: %+v", len(kinds), r.PolicyDecisions)
	}
}

// invariant is one attack's fixture: the ground truth, the built binary,
// ClickHouse, and the clusters the workload's events are stored under
// (each gets all of them, so that the inserts are not tiny).
type invariant struct {
	t        *testing.T
	gt       *groundTruth
	bin      string
	ch       *chtest.Server
	clusters []string
	bodies   [][]byte // webhook batches of the log
	accepted int      // events per cluster a sink stores
	rng      *rand.Rand

	mu    sync.Mutex
	conns map[string]driver.Conn // by database, one for the whole test
}

// conn is a connection to db; the driver reconnects after a ClickHouse
// restart.
func (iv *invariant) conn(db string) driver.Conn {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	if c := iv.conns[db]; c != nil {
		return c
	}
	c := iv.ch.Conn(iv.t, db)
	iv.conns[db] = c
	return c
}

func (iv *invariant) env() []string {
	return append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+iv.ch.DSN())
}

// serve starts a plain-HTTP `auditsink serve` on db with its own spool.
func (iv *invariant) serve(t *testing.T, db, dir, name string) (*sinkProcess, string, string) {
	t.Helper()
	addr, metrics := freeAddr(t), freeAddr(t)
	p := &sinkProcess{t: t, bin: iv.bin, args: []string{"serve", "--listen", addr, "--plaintext", "--allow-unauthenticated",
		"--spool-dir", filepath.Join(dir, "spool-"+name), "--metrics-listen", metrics, "--database", db,
		"--log-level", "warn"}, env: iv.env(), log: filepath.Join(dir, name+".log")}
	p.startPlain(metrics)
	t.Cleanup(p.kill)
	return p, "http://" + addr, metrics
}

// drained waits until the sink behind metrics has stored everything it
// acknowledged: its spool's oldest unconfirmed record is gone.
func drained(t *testing.T, metrics string) {
	t.Helper()
	eventuallyTrue(t, "the spool of "+metrics+" drained", func() bool {
		m := scrape(t, metrics)
		v, ok := m["auditsink_spool_oldest_unconfirmed_seconds"]
		return ok && v == 0
	})
}

// report runs the built `auditsink report --format json` over the
// workload's window (or [since, until)) for cluster.
func (iv *invariant) report(db, cluster string, since, until time.Time) ([]byte, error) {
	stdout, stderr, code := runBinary(iv.t, iv.env(), iv.bin, "report", "--database", db, "--cluster", cluster, "--format", "json",
		"--top", "1000", "--since", since.UTC().Format(time.RFC3339Nano), "--until", until.UTC().Format(time.RFC3339Nano))
	if code != 0 {
		return nil, fmt.Errorf("auditsink report: exit %d: %s", code, stderr)
	}
	return []byte(stdout), nil
}

// exact requires, for every cluster, the whole JSON report over the
// workload's window to equal the ground truth, and for the first cluster
// also the report over the whole hours around it (the hour caches' path)
// and the unfiltered panels of the dashboards.
func (iv *invariant) exact(t *testing.T, db, when string) {
	t.Helper()
	res := iv.gt.res
	hours := iv.gt.want
	hSince, hUntil := res.Since.Truncate(time.Hour), res.Until.Truncate(time.Hour).Add(time.Hour)
	hours.Window = report.Window{Since: hSince.UTC().Format(wl.TimeFormat), Until: hUntil.UTC().Format(wl.TimeFormat)}
	hoursJSON, _ := json.MarshalIndent(hours, "", "  ")
	start := time.Now()
	type check struct {
		cluster      string
		since, until time.Time
		want         []byte
	}
	checks := []check{{iv.clusters[0], hSince, hUntil, hoursJSON}}
	for _, cluster := range iv.clusters {
		checks = append(checks, check{cluster, res.Since, res.Until, iv.gt.json})
	}
	// The other clusters' events are the same as the first's: the
	// window that cuts hours suffices for them.
	var wg sync.WaitGroup
	diffs := make([]string, len(checks))
	for i, c := range checks {
		wg.Go(func() {
			out, err := iv.report(db, c.cluster, c.since, c.until)
			if err != nil {
				diffs[i] = err.Error()
				return
			}
			var got report.Report
			if err := json.Unmarshal(out, &got); err != nil {
				diffs[i] = fmt.Sprintf("the report is not the JSON contract: %v\n%s", err, out)
				return
			}
			if gotJSON, _ := json.MarshalIndent(got, "", "  "); !bytes.Equal(gotJSON, c.want) {
				diffs[i] = fmt.Sprintf("cluster %s, window %s..%s: the report differs from the ground truth\n%s", c.cluster,
					c.since.Format(time.RFC3339), c.until.Format(time.RFC3339), lineDiff(string(c.want), string(gotJSON)))
			}
		})
	}
	wg.Wait()
	for _, d := range diffs {
		if d != "" {
			t.Fatalf("%s: %s", when, d)
		}
	}
	iv.panels(t, db, iv.clusters[0], when)
	var rows, events uint64
	if err := iv.conn(db).QueryRow(t.Context(), "SELECT count(), uniqExact(cluster, audit_id, stage, fingerprint) FROM events_by_hour").Scan(&rows, &events); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: every report and panel equals the ground truth (checked in %s); events holds %d rows for %d events", when, time.Since(start).Round(time.Millisecond), rows, events)
}

// exactThroughMerges is exact now, and again after the hour caches are
// built and every table is merged (OPTIMIZE FINAL).
func (iv *invariant) exactThroughMerges(t *testing.T, db, when string) {
	t.Helper()
	iv.exact(t, db, when)
	iv.compact(t, db)
	iv.optimizeFinal(t, db)
	iv.exact(t, db, when+", then after compaction and OPTIMIZE FINAL")
}

// panels runs every unfiltered panel query of the dashboards for cluster
// over whole seconds around the run (no event on their edges) and
// requires their answers to equal the ground truth.
func (iv *invariant) panels(t *testing.T, db, cluster, when string) {
	t.Helper()
	res := iv.gt.res
	from, to := res.Since.Truncate(time.Second).Add(-time.Second), res.Until.Truncate(time.Second).Add(time.Second)
	gen, err := dashboards.Generate(dashboards.Options{Database: db, Top: 1000})
	if err != nil {
		t.Fatal(err)
	}
	sqls, err := gen.Expanded(asql.Expansion{From: from, To: to, Interval: 10 * time.Second,
		Vars: map[string][]string{"cluster": {cluster}, "name": {""}, "hide_system": {"no"}}, All: map[string]bool{"namespace": true, "resource": true, "user": true, "verb": true, "code": true}})
	if err != nil {
		t.Fatal(err)
	}
	conn := iv.conn(db)
	got := map[string]result{}
	for _, q := range gen.Queries {
		got[q.Name] = run(t, conn, q.Name, sqls[q.Name])
	}
	want := iv.gt.want
	t.Run("panels "+cluster+" "+when, func(t *testing.T) { panelsMatch(t, gen, got, want) })
}

// compact builds the hour caches of every closed hour that is not clean,
// as the sinks' compaction loop and the daily `auditsink migrate` do, but
// without their settling time (DefaultCompactAfter, five minutes after an
// hour's last mark, for replicas to catch up; a single server needs
// none): the binaries would compact nothing within a test. It requires
// that some hour then has a cache (every hour of the workload is closed:
// truthShift). It returns how many hours it compacted.
func (iv *invariant) compact(t *testing.T, db string) int {
	t.Helper()
	st, err := store.Open(t.Context(), store.Options{DSN: iv.ch.DSN(), Database: db})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	res, err := st.Compact(t.Context(), time.Unix(0, 0), 0)
	if err != nil {
		t.Fatalf("compact: %v", err)
	}
	var cached uint64
	if err := iv.conn(db).QueryRow(t.Context(), "SELECT count() FROM hour_caches").Scan(&cached); err != nil {
		t.Fatal(err)
	}
	t.Logf("compacted %d hours now (%v); %d compactions recorded", len(res.Hours), res.Hours, cached)
	if cached == 0 {
		t.Fatal("no hour has a cache: the reports over whole hours would not read one")
	}
	return len(res.Hours)
}

// optimizeFinal merges every part of every MergeTree table of db.
func (iv *invariant) optimizeFinal(t *testing.T, db string) {
	t.Helper()
	conn := iv.conn(db)
	rows, err := conn.Query(t.Context(), "SELECT name FROM system.tables WHERE database = ? AND engine LIKE '%MergeTree%'", db)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	if len(tables) == 0 {
		t.Fatal("no MergeTree table to optimize")
	}
	for _, tb := range tables {
		if err := conn.Exec(t.Context(), fmt.Sprintf("OPTIMIZE TABLE `%s`.`%s` FINAL", db, tb)); err != nil {
			t.Fatalf("optimize %s: %v", tb, err)
		}
	}
}

// neverOver samples cluster 0's report while writers run and requires
// every total to stay at or below the ground truth: no moment shows a
// figure over-counted. It returns a stop function that reports the
// samples taken.
//
// With same, the database already holds every event: each sample's whole
// JSON must then equal the ground truth.
func (iv *invariant) neverOver(t *testing.T, db string, same bool) func() {
	stop := make(chan struct{})
	done := make(chan int)
	want := iv.gt.want.Totals
	go func() {
		n := 0
		defer func() { done <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			out, err := iv.report(db, iv.clusters[0], iv.gt.res.Since, iv.gt.res.Until)
			if err != nil {
				continue // ClickHouse down, or the tables not there yet
			}
			var got report.Report
			if err := json.Unmarshal(out, &got); err != nil {
				t.Errorf("mid-run report: %v\n%s", err, out)
				return
			}
			n++
			if same {
				gotJSON, _ := json.MarshalIndent(got, "", "  ")
				if !bytes.Equal(gotJSON, iv.gt.json) {
					t.Errorf("a mid-run report differs from the ground truth\n%s", lineDiff(string(iv.gt.json), string(gotJSON)))
				}
				continue
			}
			g := got.Totals
			if g.Requests > want.Requests || g.WriteAttempts > want.WriteAttempts || g.VersionConflicts > want.VersionConflicts ||
				g.FieldConflicts > want.FieldConflicts || g.AlreadyExists > want.AlreadyExists || g.DeletePreconditionConflicts > want.DeletePreconditionConflicts ||
				g.StamplessUpdates > want.StamplessUpdates || g.OtherConflicts > want.OtherConflicts || g.Gone > want.Gone {
				t.Errorf("a mid-run report over-counts:\n got %+v\nwant at most %+v", g, want)
			}
		}
	}()
	return func() {
		close(stop)
		if same {
			t.Logf("%d mid-run reports, each equal to the ground truth", <-done)
		} else {
			t.Logf("%d mid-run reports, none over the ground truth", <-done)
		}
	}
}

// post delivers body to every URL at the same moment and resends it to
// each until that one answers 200, as the apiserver's webhook backend
// retries a batch. It returns how many posts got no 200.
func post(t *testing.T, urls []string, body []byte) int {
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	c := &http.Client{Timeout: 20 * time.Second}
	for _, u := range urls {
		wg.Go(func() {
			<-start
			deadline := time.Now().Add(2 * time.Minute)
			for {
				resp, err := c.Post(u, "application/json", bytes.NewReader(body))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						return
					}
				}
				failed.Add(1)
				if time.Now().After(deadline) {
					t.Errorf("POST %s: no 200 within 2 minutes (last: %v)", u, err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	close(start)
	wg.Wait()
	return int(failed.Load())
}

// sharedTruth is the workload run once for all the attacks (its apiserver
// ends with the first test that asked; the log and the truth are data).
var sharedTruth struct {
	sync.Mutex
	gt *groundTruth
}

// sharedGroundTruth is annotatedWorkload, run by the first test that asks
// and shared by the others.
func sharedGroundTruth(t *testing.T) *groundTruth {
	t.Helper()
	sharedTruth.Lock()
	defer sharedTruth.Unlock()
	if sharedTruth.gt == nil {
		sharedTruth.gt = annotatedWorkload(t)
	}
	return sharedTruth.gt
}

// newInvariant starts ClickHouse for one attack, with the workload's
// ground truth (run by the first attack that asks).
func newInvariant(t *testing.T) *invariant {
	testenv.SkipIfShort(t, "starts kube-apiserver, etcd and clickhouse-server")
	seed := time.Now().UnixNano()
	if s := os.Getenv("STAMPGUARD_FAULT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("STAMPGUARD_FAULT_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (replay with STAMPGUARD_FAULT_SEED=%d)", seed, seed)
	gt := sharedGroundTruth(t)
	iv := &invariant{t: t, gt: gt, conns: map[string]driver.Conn{}, bin: buildAuditsink(t, "", ""), ch: chtest.Start(t),
		rng: rand.New(rand.NewPCG(uint64(seed), 22))}
	for i := range 2 {
		iv.clusters = append(iv.clusters, fmt.Sprintf("inv-%d", i))
	}
	iv.bodies, iv.accepted = eventLists(t, gt.lines, 5)
	t.Logf("%d batches of up to 5 events, %d stored events per cluster, %d clusters", len(iv.bodies), iv.accepted, len(iv.clusters))
	return iv
}

// urls are the webhook URLs of cluster on each base.
func urls(bases []string, cluster string) []string {
	var out []string
	for _, b := range bases {
		out = append(out, b+"/clusters/"+cluster+"/events")
	}
	return out
}

// migrateDB creates a fresh database with the sink's schema.
func (iv *invariant) migrateDB(t *testing.T) string {
	t.Helper()
	db := iv.ch.NewDatabase(t)
	if _, stderr, code := runBinary(t, iv.env(), iv.bin, "migrate", "--database", db); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	return db
}

// slowInserts adds a materialized view on events_by_hour that sleeps 3 s per
// inserted block (ClickHouse's longest sleep): each insert of the sink
// stays in flight that long after its rows are in events, the window in
// which a kill leaves an insert applied in part, or stored but never
// acknowledged to the sink. It is dropped at the end.
func (iv *invariant) slowInserts(t *testing.T, db string) func() {
	t.Helper()
	conn := iv.conn(db)
	q := fmt.Sprintf("CREATE MATERIALIZED VIEW `%s`.slow_inserts ENGINE = Null AS SELECT sleep(3) AS slept FROM `%s`.events_by_hour", db, db)
	if err := conn.Exec(t.Context(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return func() {
		if err := iv.conn(db).Exec(t.Context(), fmt.Sprintf("DROP TABLE `%s`.slow_inserts", db)); err != nil {
			t.Fatal(err)
		}
	}
}

// lastBlock is the newest block number among events_by_hour's parts: it
// grows with every insert whose part is written (its views may still
// run), and merges keep it. (A count of rows would not do: once copies
// are stored, merges shrink it faster than inserts grow it.)
func (iv *invariant) lastBlock(t *testing.T, db string) int64 {
	var n int64
	if err := iv.conn(db).QueryRow(t.Context(), "SELECT max(max_block_number) FROM system.parts WHERE database = ? AND table = 'events_by_hour' AND active", db).Scan(&n); err != nil {
		return 0
	}
	return n
}

// storedEvents counts the distinct events stored.
func (iv *invariant) storedEvents(t *testing.T, db string) uint64 {
	var n uint64
	if err := iv.conn(db).QueryRow(t.Context(), "SELECT uniqExact(cluster, audit_id, stage, fingerprint) FROM events_by_hour").Scan(&n); err != nil {
		return 0
	}
	return n
}

// The TestExact... tests attack docs/auditsink.md's "Exactly once": the
// scripted workload's audit log (with stampguard decisions, so that every
// report section is nonzero) is stored under four clusters through the
// built `auditsink` while processes are killed. In every attack, once the
// writers have stored what they acknowledged (no compaction, merge or scan
// awaited), the whole JSON report of each cluster, over the workload's
// window and over whole hours, and every unfiltered dashboard panel equal
// the ground truth; and again after OPTIMIZE ... FINAL on every table.
// While the writers run, no report shows a total above the ground truth.
// The faults are placed by a seeded random source; the seed is logged and
// STAMPGUARD_FAULT_SEED replays it.

// TestExactWithReplicasKilled: two `serve` replicas receive every batch at
// the same moment while each is SIGKILLed at random moments and restarted;
// every post without a 200 is resent until it gets one.
func TestExactWithReplicasKilled(t *testing.T) {
	iv := newInvariant(t)
	dir := t.TempDir()
	db := iv.migrateDB(t)
	a, aURL, aMetrics := iv.serve(t, db, dir, "a")
	b, bURL, bMetrics := iv.serve(t, db, dir, "b")
	replicas := []struct {
		p       *sinkProcess
		metrics string
	}{{a, aMetrics}, {b, bMetrics}}
	// The kills: at random moments, a random replica, restarted
	// after a random pause; batches meanwhile get no 200 and are
	// resent until they do.
	stopKills := make(chan struct{})
	killsDone := make(chan int)
	delays := make([]time.Duration, 64)
	which := make([]int, 64)
	for i := range delays {
		delays[i] = time.Duration(100+iv.rng.IntN(900)) * time.Millisecond
		which[i] = iv.rng.IntN(2)
	}
	go func() {
		kills := 0
		defer func() { killsDone <- kills }()
		for i := 0; ; i++ {
			select {
			case <-stopKills:
				return
			case <-time.After(delays[i%len(delays)]):
			}
			r := replicas[which[i%len(which)]]
			r.p.kill()
			kills++
			time.Sleep(delays[(i+7)%len(delays)] / 4)
			r.p.startPlain(r.metrics)
		}
	}()
	over := iv.neverOver(t, db, false)
	var resent int
	for _, cluster := range iv.clusters {
		for _, body := range iv.bodies {
			resent += post(t, urls([]string{aURL, bURL}, cluster), body)
			time.Sleep(time.Duration(iv.rng.IntN(40)) * time.Millisecond)
		}
	}
	close(stopKills)
	kills := <-killsDone
	drained(t, aMetrics)
	drained(t, bMetrics)
	over()
	t.Logf("%d SIGKILLs, %d posts without a 200 resent", kills, resent)
	if kills == 0 || resent == 0 {
		t.Fatalf("%d kills and %d resends: the attack did not happen", kills, resent)
	}
	iv.exactThroughMerges(t, db, "after the last acknowledgement")
}

// TestExactWithClickHouseKilled: ClickHouse is SIGKILLed twice while
// an insert of one of two `serve` replicas is in flight (its rows in
// events, a view of it not done: slowInserts), and restarted; the sinks
// retry. Then, the hours compacted, every batch is delivered again and
// ClickHouse killed twice again: copies without their hour marks land in
// clean hours, and every report taken meanwhile equals the ground truth.
func TestExactWithClickHouseKilled(t *testing.T) {
	iv := newInvariant(t)
	dir := t.TempDir()
	db := iv.migrateDB(t)
	_, aURL, aMetrics := iv.serve(t, db, dir, "a")
	_, bURL, bMetrics := iv.serve(t, db, dir, "b")
	bases := []string{aURL, bURL}
	metrics := []string{aMetrics, bMetrics}

	t.Log("first delivery, ClickHouse SIGKILLed mid-insert")
	over := iv.neverOver(t, db, false)
	iv.deliverKillingClickHouse(t, db, bases, metrics, 2)
	over()
	iv.exact(t, db, "after the last acknowledgement")
	iv.compact(t, db)
	iv.exact(t, db, "after the hour caches were built")

	// Every batch again into the compacted hours: each insert cut there
	// leaves copies in events without their hour marks until its retry
	// lands. The figures are the truth at every moment.
	t.Log("every batch resent into the compacted hours, ClickHouse SIGKILLed mid-insert")
	same := iv.neverOver(t, db, true)
	iv.deliverKillingClickHouse(t, db, bases, metrics, 2)
	same()
	iv.exact(t, db, "after the resent batches' last acknowledgement")
	// A resent batch that the sinks stored in other blocks than before
	// adds marks: its hours are dirty, and compacted again. (Blocks the
	// same as before add the same marks, and leave the hours clean.)
	// `auditsink migrate` deletes the versions so superseded, and every
	// report taken while its mutations run, and after, is exact.
	// Then every hour is compacted once more, as a second compactor
	// (another serve replica) does, which supersedes one clean version
	// of each.
	again := iv.compact(t, db)
	twice := iv.compactAgain(t, db)
	same = iv.neverOver(t, db, true)
	if n := iv.prune(t, db); n != again+twice {
		t.Errorf("migrate deleted %d superseded cache versions, want %d: %d hours dirtied and compacted again, %d compacted once more", n, again+twice, again, twice)
	}
	chtest.WaitForMutations(t, iv.conn(db), db)
	same()
	iv.exact(t, db, "after the superseded cache versions were deleted")
	iv.optimizeFinal(t, db)
	iv.exact(t, db, "after the superseded cache versions were deleted, then after OPTIMIZE FINAL")
}

// compactAgain compacts every hour that has a cache once more, a second
// after the compactions before (so that its record is the newest), as a
// second compactor does: each hour then has one more superseded version.
// It returns how many hours it compacted.
func (iv *invariant) compactAgain(t *testing.T, db string) int {
	t.Helper()
	time.Sleep(1100 * time.Millisecond)
	st, err := store.Open(t.Context(), store.Options{DSN: iv.ch.DSN(), Database: db})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := iv.conn(db).Query(t.Context(), "SELECT DISTINCT toUInt32(hour) FROM hour_caches ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	var hours []time.Time
	for rows.Next() {
		var h uint32
		if err := rows.Scan(&h); err != nil {
			t.Fatal(err)
		}
		hours = append(hours, time.Unix(int64(h), 0).UTC())
	}
	rows.Close()
	for _, h := range hours {
		if err := st.CompactHour(t.Context(), h); err != nil {
			t.Fatal(err)
		}
	}
	if len(hours) == 0 {
		t.Fatal("no hour has a cache to compact again")
	}
	return len(hours)
}

// prune runs `auditsink migrate` with --prune-after 0s once the servers'
// clock (whole seconds) has passed every record and mark so far, and
// returns the superseded cache versions it deleted.
func (iv *invariant) prune(t *testing.T, db string) int {
	t.Helper()
	time.Sleep(1100 * time.Millisecond)
	stdout, stderr, code := runBinary(t, iv.env(), iv.bin, "migrate", "--database", db, "--prune-after", "0s")
	if code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	const said = "superseded cache versions deleted: "
	i := strings.Index(stdout, said)
	if i < 0 {
		t.Fatalf("migrate printed no count of deleted versions:\n%s", stdout)
	}
	var n int
	if _, err := fmt.Sscanf(stdout[i+len(said):], "%d", &n); err != nil {
		t.Fatalf("migrate printed no count of deleted versions: %v\n%s", err, stdout)
	}
	t.Logf("migrate --prune-after 0s: %d superseded cache versions deleted", n)
	return n
}

// deliverKillingClickHouse posts every batch to every base at once while
// ClickHouse is SIGKILLed kills times, each time while an insert sleeps in
// the slowInserts view: its rows are in events (a new part), the
// rest of the insert is not done, and a sink waits for its answer.
// ClickHouse restarts after a random pause; the sinks retry. It returns
// once the sinks have stored everything, and fails unless an insert
// failed.
func (iv *invariant) deliverKillingClickHouse(t *testing.T, db string, bases, metrics []string, kills int) {
	t.Helper()
	var errs0 float64
	for _, m := range metrics {
		errs0 += scrape(t, m)[`auditsink_clickhouse_errors_total{op="insert"}`]
	}
	dropSlow := iv.slowInserts(t, db)
	type delivery struct {
		cluster string
		body    []byte
		pace    time.Duration
	}
	var all []delivery
	for _, cluster := range iv.clusters {
		for _, body := range iv.bodies {
			all = append(all, delivery{cluster, body, time.Duration(iv.rng.IntN(60)) * time.Millisecond})
		}
	}
	// The batches go in one part per kill, each part posted as the wait
	// for its kill begins: every kill then finds an insert in flight,
	// however fast the sinks stored the part before.
	var wg sync.WaitGroup
	per := (len(all) + kills - 1) / kills
	for k := range kills {
		part := all[min(k*per, len(all)):min((k+1)*per, len(all))]
		before := iv.lastBlock(t, db)
		wg.Go(func() {
			for _, d := range part {
				post(t, urls(bases, d.cluster), d.body)
				time.Sleep(d.pace)
			}
		})
		eventuallyTrue(t, "an insert in flight", func() bool {
			if iv.lastBlock(t, db) <= before {
				return false
			}
			for _, m := range metrics {
				if scrape(t, m)["auditsink_spool_oldest_unconfirmed_seconds"] > 0 {
					return true
				}
			}
			return false
		})
		time.Sleep(time.Duration(iv.rng.IntN(1000)) * time.Millisecond)
		iv.ch.Kill()
		time.Sleep(time.Duration(300+iv.rng.IntN(1000)) * time.Millisecond)
		iv.ch.Start()
	}
	wg.Wait()
	for _, m := range metrics {
		drained(t, m)
	}
	dropSlow()
	var errs float64
	for _, m := range metrics {
		errs += scrape(t, m)[`auditsink_clickhouse_errors_total{op="insert"}`]
	}
	t.Logf("%d ClickHouse SIGKILLs, %v failed inserts retried", kills, errs-errs0)
	if errs == errs0 {
		t.Fatalf("%d kills and no failed insert: no insert was cut", kills)
	}
}

// TestExactWithWriterLeftDown: `serve` is SIGKILLed after ClickHouse stored
// its insert and before the insert returned (its spool unconfirmed), and
// left down: the figures are exact without it. Then what a user does: start
// serve again on the same --spool-dir; it stores its spool again, and the
// copies change nothing.
func TestExactWithWriterLeftDown(t *testing.T) {
	iv := newInvariant(t)
	dir := t.TempDir()
	db := iv.migrateDB(t)
	a, aURL, aMetrics := iv.serve(t, db, dir, "a")
	dropSlow := iv.slowInserts(t, db)
	for _, cluster := range iv.clusters {
		for _, body := range iv.bodies {
			post(t, urls([]string{aURL}, cluster), body)
		}
	}
	// Every event is in events while the last insert still sleeps in
	// the view: ClickHouse has it, serve has not heard so.
	all := uint64(iv.accepted * len(iv.clusters))
	eventuallyTrue(t, "every event in events", func() bool { return iv.storedEvents(t, db) == all })
	pending := scrape(t, aMetrics)["auditsink_spool_oldest_unconfirmed_seconds"]
	a.kill()
	if pending == 0 {
		t.Fatal("the spool was confirmed before the kill: the kill was not between insert and acknowledgement")
	}
	spool := filepath.Join(dir, "spool-a")
	if spoolOnDisk(t, spool) == 0 {
		t.Fatal("the spool of the killed writer is empty")
	}
	dropSlow()
	iv.exactThroughMerges(t, db, "with the writer down and its spool unconfirmed")
	// What the user does: start serve again on the same spool
	// directory. It stores the spool again; the copies change
	// nothing.
	a.startPlain(aMetrics)
	drained(t, aMetrics)
	iv.exact(t, db, "after the writer restarted on its spool")
}

// TestExactWithIngestAndServe: `auditsink ingest` of the log runs while
// `serve` receives the same events as webhook batches.
func TestExactWithIngestAndServe(t *testing.T) {
	iv := newInvariant(t)
	dir := t.TempDir()
	db := iv.migrateDB(t)
	_, aURL, aMetrics := iv.serve(t, db, dir, "a")
	logFile := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(logFile, []byte(strings.Join(iv.gt.lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	over := iv.neverOver(t, db, false)
	var wg sync.WaitGroup
	for _, cluster := range iv.clusters {
		wg.Go(func() {
			if _, stderr, code := runBinary(t, iv.env(), iv.bin, "ingest", "--database", db, "--cluster", cluster, "--no-progress", logFile); code != 0 {
				t.Errorf("ingest --cluster %s: exit %d: %s", cluster, code, stderr)
			}
		})
		wg.Go(func() {
			for _, body := range iv.bodies {
				post(t, urls([]string{aURL}, cluster), body)
			}
		})
	}
	wg.Wait()
	drained(t, aMetrics)
	over()
	iv.exactThroughMerges(t, db, "after the last acknowledgement")
}
