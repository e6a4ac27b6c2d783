package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/pkitest"
	"github.com/stampguard/stampguard/test/testenv"
)

// faultSink starts `auditsink serve` (the built binary) over TLS with a
// token, against ch, and returns it with its metrics address.
func faultSink(t *testing.T, bin, dir string, ch *chtest.Server, extra ...string) (*sinkProcess, string, string) {
	t.Helper()
	certFile, keyFile := pkitest.NewCA("e2e-sink-ca").Server("auditsink", "127.0.0.1").WriteFiles(t, dir)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("fault-token-0123456789abcdef0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	args := append([]string{"serve", "--listen", addr, "--tls-cert", certFile, "--tls-key", keyFile,
		"--token-file", tokenFile, "--spool-dir", filepath.Join(dir, "spool"), "--metrics-listen", metricsAddr,
		"--database", "fault", "--log-level", "info"}, extra...)
	sink := &sinkProcess{t: t, bin: bin, args: args,
		env: append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN()), log: filepath.Join(dir, "sink.log")}
	sink.start()
	t.Cleanup(sink.kill)
	return sink, addr, metricsAddr
}

func sinkClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// postBatch posts body with the token; a connection error is status 0.
func postBatch(c *http.Client, addr, path string, body []byte) (int, http.Header, []byte) {
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer fault-token-0123456789abcdef0123456789")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// scrape reads the sink's /metrics into series → value, the series named
// as exposed (`name{label="v"}`).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func spoolOnDisk(t *testing.T, dir string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size()
		}
	}
	return n
}

var auditIDField = regexp.MustCompile(`"auditID":"[^"]*"`)

// batchOf builds an EventList of n ResponseComplete events whose audit IDs
// are "<prefix>-<i>", from the real events of analytics/testdata.
func batchOf(t *testing.T, root, prefix string, n int) ([]byte, []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "analytics", "testdata", "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var templates []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.Contains(l, `"stage":"ResponseComplete"`) {
			templates = append(templates, l)
		}
	}
	var buf bytes.Buffer
	buf.WriteString(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[`)
	ids := make([]string, n)
	for i := range n {
		if i > 0 {
			buf.WriteByte(',')
		}
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		buf.WriteString(auditIDField.ReplaceAllLiteralString(templates[i%len(templates)], `"auditID":"`+ids[i]+`"`))
	}
	buf.WriteString(`]}`)
	return buf.Bytes(), ids
}

// TestAuditSinkSIGTERMWithASlowClient: a client that sends its headers
// and then a byte a second does not hold the shutdown: after SIGTERM the
// sink answers new batches 503 while it drains, cuts the slow body, says
// so in its log, and exits 0 within its 20 s shutdown timeout (below the
// pod's 30 s grace period).
func TestAuditSinkSIGTERMWithASlowClient(t *testing.T) {
	testenv.SkipIfShort(t, "builds auditsink and starts clickhouse-server")
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	bin := buildAuditsink(t, root, dir)
	ch := chtest.Start(t)
	sink, addr, _ := faultSink(t, bin, dir, ch)

	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /clusters/slow/events HTTP/1.1\r\nHost: sink\r\nAuthorization: Bearer fault-token-0123456789abcdef0123456789\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			time.Sleep(time.Second)
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	time.Sleep(1500 * time.Millisecond) // the handler is reading the body

	type exit struct {
		took time.Duration
		err  error
	}
	exited := make(chan exit, 1)
	go func() {
		took, err := sink.terminate()
		exited <- exit{took, err}
	}()
	// While the slow batch holds the drain, new batches get 503, not a
	// refused connection.
	body, _ := batchOf(t, root, "drain", 1)
	var code int
	var hdr http.Header
	for range 50 {
		if code, hdr, _ = postBatch(sinkClient(), addr, "/events", body); code == http.StatusServiceUnavailable {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Errorf("a batch during the drain got %d (Retry-After %q), want 503 with Retry-After", code, hdr.Get("Retry-After"))
	}

	if err := conn.SetReadDeadline(time.Now().Add(40 * time.Second)); err != nil {
		t.Fatal(err)
	}
	answer, rerr := io.ReadAll(conn)
	if rerr != nil {
		t.Errorf("the slow connection was not cut: %v (read %q)", rerr, answer)
	}
	e := <-exited
	if e.err != nil {
		t.Errorf("auditsink serve exited with %v after SIGTERM, want 0", e.err)
	}
	if e.took >= 25*time.Second {
		t.Errorf("SIGTERM took %s, want < 25s (the shutdown timeout is 20s, the pod's grace 30s)", e.took)
	}
	t.Logf("SIGTERM to exit: %s; the slow client read %q", e.took.Round(time.Millisecond), firstLine(answer))
	log, _ := os.ReadFile(sink.log)
	if !bytes.Contains(log, []byte("still arriving at shutdown; connection cut")) {
		t.Errorf("the log does not say the slow body was cut:\n%s", log)
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\r\n")
	return s
}

// TestAuditSinkFaultSuite runs the built sink through the faults of a
// demanding operator while a stream of batches is delivered the way the
// apiserver does (each batch retried until it is answered 200): five
// SIGKILLs in mid-stream, a ClickHouse outage that fills a small spool
// (503 with Retry-After, then recovery) with a SIGKILL inside it, and
// batches resent after their acknowledgement. Every acknowledged event is
// stored exactly once, and the metrics tell the outage as it happens.
func TestAuditSinkFaultSuite(t *testing.T) {
	testenv.SkipIfShort(t, "builds auditsink and starts clickhouse-server")
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	bin := buildAuditsink(t, root, dir)
	ch := chtest.Start(t)
	sink, addr, metricsAddr := faultSink(t, bin, dir, ch, "--spool-max", "4MiB")
	spoolDir := filepath.Join(dir, "spool")

	const batches, perBatch = 60, 200
	var (
		mu         sync.Mutex
		acked      = map[string]int{} // audit ID → batches answered 200 that held it
		bodies     [][]byte           // acknowledged bodies, for the resend
		sinceStart float64            // events acknowledged since the sink's last start
		refused503 atomic.Int64
		retryAfter atomic.Bool
		sent       atomic.Int64
		pause      atomic.Bool
		generation int // of the sink process, under mu: restarts so far
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := sinkClient()
		for i := range batches {
			body, ids := batchOf(t, root, fmt.Sprintf("fault-%d", i), perBatch)
			for {
				for pause.Load() {
					time.Sleep(20 * time.Millisecond)
				}
				mu.Lock()
				gen := generation
				mu.Unlock()
				code, hdr, answer := postBatch(c, addr, "/clusters/fault/events", body)
				if code == http.StatusOK {
					var a struct{ Accepted int }
					if err := json.Unmarshal(answer, &a); err != nil || a.Accepted != perBatch {
						t.Errorf("batch %d: answer %q (%v)", i, answer, err)
					}
					mu.Lock()
					for _, id := range ids {
						acked[id]++
					}
					bodies = append(bodies, body)
					if gen == generation { // answered by the process running now
						sinceStart += float64(a.Accepted)
					}
					mu.Unlock()
					sent.Add(1)
					break
				}
				if code == http.StatusServiceUnavailable {
					refused503.Add(1)
					if hdr.Get("Retry-After") != "" {
						retryAfter.Store(true)
					}
				}
				time.Sleep(100 * time.Millisecond) // the apiserver waits longer; the test need not
			}
		}
	}()
	waitSent := func(n int64) {
		t.Helper()
		eventuallyTrue(t, fmt.Sprintf("%d batches acknowledged", n), func() bool { return sent.Load() >= n })
	}
	restart := func() {
		sink.kill()
		mu.Lock()
		sinceStart = 0
		generation++
		mu.Unlock()
		sink.start()
	}

	t.Log("SIGKILL the sink five times in mid-stream")
	for k := range 4 {
		waitSent(int64(4 * (k + 1)))
		restart()
	}

	t.Log("stop ClickHouse until the spool is full")
	waitSent(20)
	ch.Stop()
	eventuallyTrue(t, "a 503 from the full spool", func() bool { return refused503.Load() > 0 })
	if !retryAfter.Load() {
		t.Error("the full spool's 503 had no Retry-After")
	}
	pause.Store(true)
	restart() // the fifth SIGKILL, inside the outage: the spool is replayed, migration fails
	eventuallyTrue(t, "a failed migration counted", func() bool {
		return scrape(t, metricsAddr)[`auditsink_clickhouse_errors_total{op="migrate"}`] >= 1
	})
	m := scrape(t, metricsAddr)
	if disk := spoolOnDisk(t, spoolDir); m["auditsink_spool_bytes"] != float64(disk) || disk < 2<<20 {
		t.Errorf("during the outage auditsink_spool_bytes = %v, segments on disk %d bytes (the spool is full)", m["auditsink_spool_bytes"], disk)
	}
	if m["auditsink_spool_oldest_unconfirmed_seconds"] <= 0 {
		t.Errorf("during the outage auditsink_spool_oldest_unconfirmed_seconds = %v, want > 0", m["auditsink_spool_oldest_unconfirmed_seconds"])
	}
	pause.Store(false)
	eventuallyTrue(t, "a spool_full refusal counted", func() bool {
		return scrape(t, metricsAddr)[`auditsink_batches_refused_total{reason="spool_full"}`] >= 1
	})
	ch.Start()
	<-done

	t.Log("resend acknowledged batches")
	mu.Lock()
	resend := slicesClone(bodies[len(bodies)-10:])
	mu.Unlock()
	for i, body := range resend {
		if code, _, answer := postBatch(sinkClient(), addr, "/clusters/fault/events", body); code != http.StatusOK {
			t.Fatalf("resending batch %d: %d %s", i, code, answer)
		}
		mu.Lock()
		sinceStart += perBatch
		mu.Unlock()
	}
	eventuallyTrue(t, "the spool to drain", func() bool {
		m := scrape(t, metricsAddr)
		return m["auditsink_spool_oldest_unconfirmed_seconds"] == 0 && m["auditsink_spool_bytes"] == float64(spoolOnDisk(t, spoolDir))
	})
	m = scrape(t, metricsAddr)
	if m["auditsink_spool_bytes"] != 0 {
		t.Errorf("after recovery auditsink_spool_bytes = %v, want 0 (everything confirmed and reclaimed)", m["auditsink_spool_bytes"])
	}
	mu.Lock()
	wantAccepted := sinceStart
	mu.Unlock()
	if got := m[`auditsink_events_accepted_total{source="webhook"}`]; got != wantAccepted {
		t.Errorf("auditsink_events_accepted_total = %v, want the %v events answered 200 since the last start", got, wantAccepted)
	}
	if ins := m[`auditsink_clickhouse_errors_total{op="insert"}`] + m[`auditsink_clickhouse_errors_total{op="lookup"}`] + m[`auditsink_clickhouse_errors_total{op="migrate"}`]; ins < 1 {
		t.Errorf("no ClickHouse error counted across the outage: %v", ins)
	}

	conn := ch.Conn(t, "fault")
	rows, err := conn.Query(t.Context(), "SELECT audit_id, count() FROM events_by_hour WHERE cluster = 'fault' GROUP BY audit_id")
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]uint64{}
	for rows.Next() {
		var id string
		var n uint64
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		stored[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var missing, doubled int
	for id := range acked {
		switch n := stored[id]; {
		case n == 0:
			missing++
		case n > 1:
			doubled++
		}
	}
	// Copies (a resent batch, a replayed spool record) are rows that
	// every read takes once (docs/auditsink.md, "Exactly once").
	t.Logf("%d events acknowledged (%d batches, 10 resent), %d distinct stored, %d of them more than once, %d 503s",
		len(acked), batches, len(stored), doubled, refused503.Load())
	if len(acked) != batches*perBatch || missing != 0 || len(stored) != len(acked) {
		t.Errorf("%d acknowledged, %d stored: %d missing", len(acked), len(stored), missing)
	}
}

// TestAuditSinkAnswersBadInput posts every kind of bad body to the built
// sink, each to its own cluster, and checks the answer and what reached
// ClickHouse: a 400 naming the problem and nothing stored for a body that
// is not a v1 EventList, a 200 with dead letters (and the valid
// neighbours as rows) for damage inside one.
func TestAuditSinkAnswersBadInput(t *testing.T) {
	testenv.SkipIfShort(t, "builds auditsink and starts clickhouse-server")
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	bin := buildAuditsink(t, root, dir)
	ch := chtest.Start(t)
	_, addr, _ := faultSink(t, bin, dir, ch, "--max-event-bytes", "4096")

	list, _ := batchOf(t, root, "bad", 2)
	one, _ := batchOf(t, root, "single", 1)
	event := strings.TrimSuffix(strings.TrimPrefix(string(one), `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[`), `]}`)
	wrap := func(items ...string) string {
		return `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[` + strings.Join(items, ",") + `]}`
	}
	big := strings.Replace(event, `{`, `{"pad":"`+strings.Repeat("x", 5000)+`",`, 1)
	tests := []struct {
		cluster, body string
		status        int
		answer        string // in the body of the answer
		rows          int    // events stored for the cluster
		deadReason    string // the one dead letter's reason ("" for none)
	}{
		{"garbage", "not json", 200, `"rejected":1`, 0, "malformed EventList: expected an object"},
		{"truncated", string(list[:len(list)-300]), 200, `"accepted":1,"rejected":1`, 1, "unexpected end of input"},
		{"no-audit-id", wrap(strings.Replace(event, `"auditID":"single-0"`, `"auditID":""`, 1)), 200, `"rejected":1`, 0, "event has no auditID"},
		{"oversized", wrap(big, event), 200, `"accepted":1,"rejected":1`, 1, fmt.Sprintf("event of %d bytes is larger than the limit of 4096 bytes", len(big))},
		{"single-event", event, 400, `kind "Event": a single audit Event`, 0, ""},
		{"kind-pod", strings.Replace(wrap(event), `"EventList"`, `"Pod"`, 1), 400, `kind "Pod"`, 0, ""},
		{"v1beta1", strings.Replace(wrap(event), `"audit.k8s.io/v1"`, `"audit.k8s.io/v1beta1"`, 1), 400, `apiVersion "audit.k8s.io/v1beta1" is not read`, 0, ""},
		{"items-object", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{"a":1}}`, 400, "items is an object, not an array", 0, ""},
		{"no-items", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1"}`, 400, "no items", 0, ""},
	}
	c := sinkClient()
	for _, tt := range tests {
		code, _, answer := postBatch(c, addr, "/clusters/"+tt.cluster+"/events", []byte(tt.body))
		if code != tt.status || !strings.Contains(string(answer), tt.answer) {
			t.Errorf("%s: %d %q, want %d with %q", tt.cluster, code, answer, tt.status, tt.answer)
		}
	}
	conn := ch.Conn(t, "fault")
	count := func(q, cluster string) uint64 {
		var n uint64
		if err := conn.QueryRow(t.Context(), q, cluster).Scan(&n); err != nil {
			return ^uint64(0) // tables not yet created by the sink's migration
		}
		return n
	}
	// The spool is drained in order: once the last 200's rows are in,
	// all of them are.
	eventuallyTrue(t, "the dead letters in ClickHouse", func() bool {
		return count("SELECT count() FROM dead_letters WHERE cluster = ?", "oversized") == 1
	})
	for _, tt := range tests {
		if n := count("SELECT count() FROM events_by_hour WHERE cluster = ?", tt.cluster); n != uint64(tt.rows) {
			t.Errorf("%s: %d events stored, want %d", tt.cluster, n, tt.rows)
		}
		var reasons []string
		rows, err := conn.Query(t.Context(), "SELECT reason FROM dead_letters WHERE cluster = ?", tt.cluster)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var r string
			if err := rows.Scan(&r); err != nil {
				t.Fatal(err)
			}
			reasons = append(reasons, r)
		}
		rows.Close()
		switch {
		case tt.deadReason == "" && len(reasons) != 0:
			t.Errorf("%s: dead letters %q, want none (the body was refused)", tt.cluster, reasons)
		case tt.deadReason != "" && (len(reasons) != 1 || !strings.Contains(reasons[0], tt.deadReason)):
			t.Errorf("%s: dead letters %q, want one saying %q", tt.cluster, reasons, tt.deadReason)
		}
	}
}
