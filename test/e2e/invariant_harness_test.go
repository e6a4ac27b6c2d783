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
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/testenv"
	wl "github.com/stampguard/stampguard/test/workload"
)

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
