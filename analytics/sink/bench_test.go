package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/proctest"
)

// benchTemplates are real-shaped RequestResponse/Request events of 1–2 KB
// (a conflict, an SSA conflict, a stampless update, a lease renewal).
func benchTemplates(b *testing.B) []string {
	ev := audittest.Events(b)
	return mixTemplates(b, []string{ev[0], ev[1], ev[5], ev[6], ev[0]})
}

// mixTemplates are the events a benchmark repeats: mix, or with
// AUDITSINK_BENCH_MIX=writes 4,000 of audittest.WriteWrites' events, every
// one a write logged with its request and response, so every one has a
// field history row (the history's heaviest mix).
func mixTemplates(b *testing.B, mix []string) []string {
	switch m := os.Getenv("AUDITSINK_BENCH_MIX"); m {
	case "":
		return mix
	case "writes":
		return audittest.Writes(b, 4000)
	default:
		b.Fatalf("AUDITSINK_BENCH_MIX=%q: want writes, or nothing for the real-shaped mix", m)
		return nil
	}
}

// benchBody builds a batch of n events whose audit IDs are unique per
// (run, batch, index), so nothing is deduplicated away.
func benchBody(templates []string, run, batch, n int) []byte {
	var buf bytes.Buffer
	buf.WriteString(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[`)
	for i := range n {
		if i > 0 {
			buf.WriteByte(',')
		}
		t := templates[i%len(templates)]
		k := strings.Index(t, `"auditID":"`) + len(`"auditID":"`)
		buf.WriteString(t[:k])
		fmt.Fprintf(&buf, "r%d-b%d-i%d-", run, batch, i)
		buf.WriteString(t[k:])
	}
	buf.WriteString("]}")
	return buf.Bytes()
}

type benchEnv struct {
	ch  *chtest.Server
	url string
	db  string
	pid int
}

// buildSink compiles cmd/auditsink once per benchmark.
func buildSink(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "auditsink")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/auditsink")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// profiles numbers the CPU profiles written under AUDITSINK_BENCH_PROFILE_DIR.
var profiles int

// startSinkProcess runs `auditsink serve` as its own process, as in
// production, so that its peak RSS can be read.
func startSinkProcess(b *testing.B, bin string, ch *chtest.Server, parallel int) (benchEnv, func() int64) {
	db := ch.NewDatabase(b)
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("bench-0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		b.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "serve", "--plaintext", "--listen", addr, "--token-file", filepath.Join(dir, "token"),
		"--spool-dir", filepath.Join(dir, "spool"), "--spool-max", "4GiB", "--metrics-listen", "",
		"--database", db, "--insert-parallel", strconv.Itoa(parallel), "--log-level", "warn")
	// AUDITSINK_BENCH_SERVE_FLAGS adds flags (--no-field-history: the
	// field history's cost, side by side).
	cmd.Args = append(cmd.Args, strings.Fields(os.Getenv("AUDITSINK_BENCH_SERVE_FLAGS"))...)
	if d := os.Getenv("AUDITSINK_BENCH_PROFILE_DIR"); d != "" {
		// One CPU profile per sink process: go tool pprof <binary> <file>.
		profiles++
		cmd.Args = append(cmd.Args, "--cpu-profile", filepath.Join(d, fmt.Sprintf("sink-%d.pprof", profiles)))
	}
	dsn := ch.DSN()
	if queryCPU() {
		dsn += "&log_queries=1"
	}
	cmd.Env = append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+dsn)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("sink did not listen")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop := func() int64 {
		rss := proctest.PeakRSS(cmd.Process.Pid)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait() // exit status after SIGTERM is not the point
		return rss
	}
	return benchEnv{ch: ch, url: "http://" + addr, db: db, pid: cmd.Process.Pid}, stop
}

func post400(c *http.Client, url string, body []byte) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/clusters/bench/events", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer bench-0123456789abcdef0123456789abcdef")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

func waitCount(b *testing.B, ch *chtest.Server, db string, want uint64) {
	conn := ch.Conn(b, db)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n uint64
		if err := conn.QueryRow(context.Background(), "SELECT count() FROM events_by_hour").Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == want {
			return
		}
		if n > want || time.Now().After(deadline) {
			b.Fatalf("events = %d, want %d", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkEndToEnd sends HTTP batches of 400 events (4 concurrent
// senders, like several apiservers) to `auditsink serve` (its own process)
// through spool fsync into ClickHouse,
// timed until the last event is in the events table, and in the same run
// measures the ceiling: clickhouse-client inserting the same flattened rows
// as TSV into the same schema. AUDITSINK_BENCH_MIX=writes sends only writes
// logged with their responses (mixTemplates).
func BenchmarkEndToEnd(b *testing.B) {
	for _, parallel := range []int{1, 2} {
		b.Run(fmt.Sprintf("inserts=%d", parallel), func(b *testing.B) { benchEndToEnd(b, parallel) })
	}
}

// benchEvents is the events sent per iteration of BenchmarkEndToEnd:
// 100,000, or AUDITSINK_BENCH_EVENTS for a sustained run (bodies beyond the
// first 250 are built by the senders as they go, and the ceiling is
// measured on the first 250).
func benchEvents() int {
	if v, err := strconv.Atoi(os.Getenv("AUDITSINK_BENCH_EVENTS")); err == nil && v >= 400 {
		return v
	}
	return 100_000
}

func benchEndToEnd(b *testing.B, parallel int) {
	const (
		perBody  = 400
		senders  = 4
		prebuilt = 250 // bodies built before the clock starts (100,000 events)
	)
	batches := benchEvents() / perBody
	ch := chtest.Start(b)
	templates := benchTemplates(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: senders}}
	var sinkSecs, ceilSecs, acceptSecs float64
	var rss int64
	var sinkCPU, chCPU float64
	queriesCPU := map[string]float64{}
	bin := buildSink(b)
	run := 0
	b.ReportAllocs()
	for b.Loop() {
		run++
		b.StopTimer()
		env, stopSink := startSinkProcess(b, bin, ch, parallel)
		bodies := make([][]byte, min(batches, prebuilt))
		for i := range bodies {
			bodies[i] = benchBody(templates, run, i, perBody)
		}
		body := func(i int) []byte {
			if i < len(bodies) {
				return bodies[i]
			}
			return benchBody(templates, run, i, perBody)
		}
		b.StartTimer()
		start := time.Now()
		sinkCPU0, chCPU0 := proctest.CPUSeconds(env.pid), proctest.CPUSeconds(ch.PID())
		var next atomic.Int64
		var wg sync.WaitGroup
		for range senders {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < batches; i = int(next.Add(1)) - 1 {
					if code, err := post400(client, env.url, body(i)); err != nil || code != 200 {
						b.Errorf("batch %d: %d %v", i, code, err)
						return
					}
				}
			})
		}
		wg.Wait()
		acceptSecs += time.Since(start).Seconds()
		waitCount(b, ch, env.db, uint64(batches*perBody))
		sinkSecs += time.Since(start).Seconds()
		sinkCPU += proctest.CPUSeconds(env.pid) - sinkCPU0
		chCPU += proctest.CPUSeconds(ch.PID()) - chCPU0
		b.StopTimer()
		rss = max(rss, stopSink())
		if queryCPU() {
			for kind, secs := range sinkQueryCPU(b, ch, env.db) {
				queriesCPU[kind] += secs
			}
		}
		ceilSecs += ceiling(b, ch, bodies)
		b.StartTimer()
	}
	events := float64(run * batches * perBody)
	ceilEvents := float64(run * min(batches, prebuilt) * perBody)
	b.ReportMetric(events/sinkSecs, "events/s")
	b.ReportMetric(ceilEvents/ceilSecs, "ceiling-events/s")
	b.ReportMetric(events/acceptSecs, "accepted-events/s")
	b.ReportMetric((events/sinkSecs)/(ceilEvents/ceilSecs), "ratio")
	b.ReportMetric(float64(rss)/(1<<20), "sink-peak-RSS-MiB")
	b.ReportMetric(sinkCPU*1e6/events, "sink-cpu-µs/event")
	b.ReportMetric(chCPU*1e6/events, "clickhouse-cpu-µs/event")
	for kind, secs := range queriesCPU {
		b.ReportMetric(secs*1e6/events, kind+"-cpu-µs/event")
	}
}

// queryCPU: AUDITSINK_BENCH_QUERY_CPU=1 has the sink log its queries, and
// BenchmarkEndToEnd reports the ClickHouse CPU of each kind of the
// writer's statements per event (sinkQueryCPU): steadier than the
// throughput on a noisy machine, and it says where a change of the
// writer's path costs.
func queryCPU() bool { return os.Getenv("AUDITSINK_BENCH_QUERY_CPU") == "1" }

// sinkQueryCPU sums the CPU (user and system) that ClickHouse's query log
// records for the writer's statements on database db, by kind: the
// events insert (with its hour-mark view) and the compaction.
func sinkQueryCPU(b *testing.B, ch *chtest.Server, db string) map[string]float64 {
	conn := ch.Conn(b, "default")
	if err := conn.Exec(context.Background(), "SYSTEM FLUSH LOGS"); err != nil {
		b.Fatal(err)
	}
	rows, err := conn.Query(context.Background(), `SELECT
			multiIf(startsWith(query, concat('INSERT INTO ', ?, '.events_by_hour ')), 'insert',
				position(query, '.hour_') > 0, 'compaction', '') AS kind,
			sum(ProfileEvents.Values[indexOf(ProfileEvents.Names, 'UserTimeMicroseconds')] +
				ProfileEvents.Values[indexOf(ProfileEvents.Names, 'SystemTimeMicroseconds')]) / 1e6
		FROM system.query_log WHERE type = 2 AND position(query, ?) > 0 AND position(query, 'query_log') = 0
		GROUP BY kind HAVING kind != ''`, db, db)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var kind string
		var secs float64
		if err := rows.Scan(&kind, &secs); err != nil {
			b.Fatal(err)
		}
		out[kind] = secs
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if len(out) == 0 {
		b.Fatal("the query log holds none of the sink's statements")
	}
	return out
}

// ceiling times clickhouse-client inserting the bodies' flattened rows as
// TabSeparated into one MergeTree with the events' columns and sorting
// key and no views.
func ceiling(b *testing.B, ch *chtest.Server, bodies [][]byte) float64 {
	db := ch.NewDatabase(b)
	st, err := store.Open(context.Background(), store.Options{DSN: ch.DSN(), Database: db})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	// ClickHouse's own insert speed (issue 22): the events' columns and
	// sorting key in one MergeTree, no views.
	if err := st.Conn().Exec(context.Background(), "CREATE TABLE "+db+".ceiling AS "+db+".events_by_hour ENGINE = MergeTree() PARTITION BY event_date "+
		"ORDER BY (cluster, intDiv(event_time_us, 3600000000), api_group, resource, namespace, name, event_time_us, audit_id, stage, fingerprint)"); err != nil {
		b.Fatal(err)
	}
	var tsv bytes.Buffer
	// The rows the sink would store: each event decoded as the Accepter
	// decodes it, of the stages it keeps.
	var d audit.Decoder
	n := 0
	for _, body := range bodies {
		items := audit.NewListReader(bytes.NewReader(body), 0)
		for {
			it, err := items.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			var row audit.Row
			if it.Err != nil || d.Decode(string(it.Raw), &row) != nil || !slices.Contains(audit.DefaultStages, row.Stage) {
				continue
			}
			row.Cluster = "bench"
			writeTSV(&tsv, &row)
			n++
		}
	}
	start := time.Now()
	cmd := exec.Command("clickhouse-client", "--port", strconv.Itoa(ch.Port), "--database", db,
		"--query", "INSERT INTO ceiling ("+record.EventColumns+") FORMAT TabSeparated")
	cmd.Stdin = &tsv
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("clickhouse-client: %v: %s", err, out)
	}
	secs := time.Since(start).Seconds()
	var stored uint64
	if err := st.Conn().QueryRow(context.Background(), "SELECT count() FROM "+db+".ceiling").Scan(&stored); err != nil || stored != uint64(n) {
		b.Fatalf("the ceiling stored %d of %d rows (%v)", stored, n, err)
	}
	return secs
}

var tsvEscape = strings.NewReplacer("\\", "\\\\", "\t", "\\t", "\n", "\\n", "'", "\\'")

func writeTSV(w *bytes.Buffer, r *audit.Row) {
	t := time.UnixMicro(r.StageMicros).UTC()
	// The latency column: stage - received, 0 when unknown or negative.
	var latency int64
	if r.RequestReceivedMicros != 0 && r.StageMicros >= r.RequestReceivedMicros {
		latency = r.StageMicros - r.RequestReceivedMicros
	}
	str := func(s string) { w.WriteString(tsvEscape.Replace(s)) }
	arr := func(l []string) {
		w.WriteByte('[')
		for i, s := range l {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteByte('\'')
			str(s)
			w.WriteByte('\'')
		}
		w.WriteByte(']')
	}
	dry := 0
	if r.DryRun {
		dry = 1
	}
	fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t", t.Format(time.DateOnly), t.Format(time.DateTime), r.StageMicros, r.RequestReceivedMicros, latency)
	for _, s := range []string{r.Cluster, r.AuditID, r.Stage} {
		str(s)
		w.WriteByte('\t')
	}
	fmt.Fprintf(w, "%d\t", r.Fingerprint)
	for _, s := range []string{r.Level, r.Verb, r.RequestURI} {
		str(s)
		w.WriteByte('\t')
	}
	fmt.Fprintf(w, "%d\t", dry)
	str(r.User)
	w.WriteByte('\t')
	arr(r.UserGroups)
	w.WriteByte('\t')
	for _, s := range []string{r.ImpersonatedUser, r.Writer(), r.UserAgent, r.SourceIP, r.APIGroup, r.APIVersion,
		r.Resource, r.Subresource, r.Namespace, r.Name, r.ObjectUID, r.Stamp, r.FieldManager} {
		str(s)
		w.WriteByte('\t')
	}
	fmt.Fprintf(w, "%d\t", r.Code)
	str(r.Reason)
	w.WriteByte('\t')
	str(r.Message)
	w.WriteByte('\t')
	arr(r.CauseReasons)
	w.WriteByte('\t')
	arr(r.CauseFields)
	w.WriteByte('\t')
	str(r.AuthzDecision)
	w.WriteByte('\t')
	arr(r.AnnotationKeys)
	w.WriteByte('\t')
	arr(r.AnnotationValues)
	w.WriteByte('\t')
	str(r.LeaseHolder)
	w.WriteString("\t\n") // raw: empty, as the sink stores it by default
}

// BenchmarkBatchLatency sends one 400-event batch every 100 ms (4,000
// events/s, one apiserver's default ceiling) to `auditsink serve` (its own
// process, so its GC settings and memory limit apply and the client does not
// share its heap) and reports the p50 and p99 time to the 200 answer, which
// includes the spool fsync, with the sink's peak RSS and the CPU the sink
// and ClickHouse used meanwhile (percent of one core).
func BenchmarkBatchLatency(b *testing.B) {
	ch := chtest.Start(b)
	env, stopSink := startSinkProcess(b, buildSink(b), ch, 2)
	templates := benchTemplates(b)
	client := &http.Client{}
	var lat []time.Duration
	run := 0
	start, sinkCPU0, chCPU0 := time.Now(), proctest.CPUSeconds(env.pid), proctest.CPUSeconds(ch.PID())
	for b.Loop() {
		run++
		body := benchBody(templates, 1000+run, 0, 400)
		t0 := time.Now()
		if code, err := post400(client, env.url, body); err != nil || code != 200 {
			b.Fatalf("%d %v", code, err)
		}
		d := time.Since(t0)
		lat = append(lat, d)
		time.Sleep(100*time.Millisecond - d)
	}
	secs := time.Since(start).Seconds()
	sinkCPU, chCPU := proctest.CPUSeconds(env.pid)-sinkCPU0, proctest.CPUSeconds(ch.PID())-chCPU0
	rss := stopSink()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(rss)/(1<<20), "sink-peak-RSS-MiB")
	b.ReportMetric(100*sinkCPU/secs, "sink-cpu-%")
	b.ReportMetric(100*chCPU/secs, "clickhouse-cpu-%")
}
