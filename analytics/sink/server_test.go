package sink

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/pkitest"

	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/testenv"
)

func eventList(events ...string) string {
	return `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`
}

// newSpoolHandler is a handler over a spool with no writer, for tests of the
// HTTP contract alone.
func newSpoolHandler(t *testing.T, o HandlerOptions, spoolMax int64) (*Handler, *spool.Spool) {
	t.Helper()
	sp, err := spool.Open(t.TempDir(), spool.Options{MaxBytes: spoolMax})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	o.Spool = sp
	if o.Accepter == nil {
		o.Accepter = &pipeline.Accepter{}
	}
	h, err := NewHandler(o)
	if err != nil {
		t.Fatal(err)
	}
	return h, sp
}

type call struct {
	status int
	body   string
	header http.Header
}

func post(t *testing.T, h http.Handler, path, body string, hdr map[string]string) call {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := &recorder{header: http.Header{}}
	h.ServeHTTP(rec, req)
	return call{rec.status, rec.buf.String(), rec.header}
}

type recorder struct {
	header http.Header
	buf    bytes.Buffer
	status int
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return r.buf.Write(b)
}
func (r *recorder) WriteHeader(s int) { r.status = s }

func TestHandlerContract(t *testing.T) {
	events := audittest.Events(t)
	gz := func(s string) string {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	bearer := map[string]string{"Authorization": "Bearer s3cret"}
	tests := []struct {
		name       string
		path, body string
		hdr        map[string]string
		maxBody    int64
		wantStatus int
		wantAnswer *Answer
	}{
		{"a valid batch is acknowledged with its counts after the spool append", "/clusters/prod/events", eventList(events...), bearer, 0, 200, &Answer{Accepted: 10, Skipped: 1}},
		{"a request without the token is refused", "/clusters/prod/events", eventList(events...), nil, 0, 401, nil},
		{"a wrong token of the same length is refused", "/clusters/prod/events", eventList(events...), map[string]string{"Authorization": "Bearer s3creT"}, 0, 401, nil},
		{"invalid events are counted as rejected while their neighbours are accepted", "/clusters/prod/events", eventList(events[0], `{"auditID":""}`, `7`, events[1]), bearer, 0, 200, &Answer{Accepted: 2, Rejected: 2}},
		{"a body that is not JSON is a dead letter, not a retry", "/clusters/prod/events", "not json", bearer, 0, 200, &Answer{Rejected: 1}},
		{"a gzip body with Content-Encoding is decoded", "/clusters/prod/events", gz(eventList(events[:3]...)), map[string]string{"Authorization": "Bearer s3cret", "Content-Encoding": "gzip"}, 0, 200, &Answer{Accepted: 3}},
		{"a gzip body without Content-Encoding is detected", "/clusters/prod/events", gz(eventList(events[:2]...)), bearer, 0, 200, &Answer{Accepted: 2}},
		{"a body above the limit is 413", "/clusters/prod/events", eventList(events...), bearer, 4096, 413, nil},
		{"a bad cluster name is 400", "/clusters/..bad/events", eventList(events...), bearer, 0, 400, nil},
		{"the default cluster serves /events", "/events", eventList(events[:1]...), bearer, 0, 200, &Answer{Accepted: 1}},
		{"a single Event without the EventList wrapper is 400", "/clusters/prod/events", events[0], bearer, 0, 400, nil},
		{"kind Pod is 400", "/clusters/prod/events", `{"kind":"Pod","apiVersion":"audit.k8s.io/v1","items":[` + events[0] + `]}`, bearer, 0, 400, nil},
		{"apiVersion audit.k8s.io/v1beta1 is 400", "/clusters/prod/events", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1beta1","items":[` + events[0] + `]}`, bearer, 0, 400, nil},
		{"items that are an object are 400", "/clusters/prod/events", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{"a":1}}`, bearer, 0, 400, nil},
		{"an EventList without items is 400", "/clusters/prod/events", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1"}`, bearer, 0, 400, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, sp := newSpoolHandler(t, HandlerOptions{Token: "s3cret", DefaultCluster: "dev", MaxBodyBytes: tt.maxBody}, 0)
			c := post(t, h, tt.path, tt.body, tt.hdr)
			if c.status != tt.wantStatus {
				t.Fatalf("status %d (%s), want %d", c.status, c.body, tt.wantStatus)
			}
			pending := sp.Stats().RecordsPending
			if tt.wantAnswer == nil {
				if pending != 0 {
					t.Errorf("answered %d, yet %d records are in the spool", c.status, pending)
				}
				return
			}
			var a Answer
			if err := json.Unmarshal([]byte(c.body), &a); err != nil {
				t.Fatalf("answer %q: %v", c.body, err)
			}
			if a != *tt.wantAnswer {
				t.Errorf("answer %+v, want %+v", a, *tt.wantAnswer)
			}
			if (a.Accepted+a.Rejected > 0) != (pending > 0) {
				t.Errorf("%d records pending in the spool after answer %+v", pending, a)
			}
		})
	}
}

func TestHandlerAsksForRetryOnlyWhenTheSpoolIsFullOrDraining(t *testing.T) {
	events := audittest.Events(t)
	bearer := map[string]string{"Authorization": "Bearer t"}
	h, _ := newSpoolHandler(t, HandlerOptions{Token: "t"}, 64<<10)
	body := eventList(events...)
	var last call
	for range 100 {
		if last = post(t, h, "/clusters/prod/events", body, bearer); last.status != 200 {
			break
		}
	}
	if last.status != 503 || last.header.Get("Retry-After") == "" {
		t.Fatalf("a full spool answered %d (Retry-After %q), want 503 with Retry-After", last.status, last.header.Get("Retry-After"))
	}
	if c := get(t, h, "/readyz"); c.status != 503 || !strings.Contains(c.body, "spool was full") {
		t.Fatalf("/readyz of a sink whose spool is full answered %d %q, want 503", c.status, c.body)
	}
	if c := get(t, h, "/healthz"); c.status != 200 {
		t.Fatalf("/healthz of a sink whose spool is full answered %d: liveness would restart it", c.status)
	}

	h2, _ := newSpoolHandler(t, HandlerOptions{Token: "t"}, 0)
	if c := get(t, h2, "/readyz"); c.status != 200 {
		t.Fatalf("/readyz of a fresh sink answered %d %q", c.status, c.body)
	}
	h2.Drain()
	if c := post(t, h2, "/clusters/prod/events", body, bearer); c.status != 503 {
		t.Fatalf("a draining sink answered %d, want 503", c.status)
	}
	if c := get(t, h2, "/readyz"); c.status != 503 || !strings.Contains(c.body, "shutting down") {
		t.Fatalf("/readyz of a draining sink answered %d %q, want 503", c.status, c.body)
	}
}

// TestReadyAgainOnceTheSpoolShrinks: a sink that refused a batch for a full
// spool is ready again once the spool's confirmed segments are gone.
func TestReadyAgainOnceTheSpoolShrinks(t *testing.T) {
	bearer := map[string]string{"Authorization": "Bearer t"}
	h, sp := newSpoolHandler(t, HandlerOptions{Token: "t"}, 64<<10)
	body := eventList(audittest.Events(t)...)
	for range 100 {
		if post(t, h, "/clusters/prod/events", body, bearer).status != 200 {
			break
		}
	}
	if get(t, h, "/readyz").status != 503 {
		t.Fatal("not unready after a refusal for a full spool")
	}
	for {
		b, err := sp.Next(t.Context(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if err := sp.Confirm(b.End); err != nil {
			t.Fatal(err)
		}
		if sp.Stats().RecordsPending == 0 {
			break
		}
	}
	if c := get(t, h, "/readyz"); c.status != 200 {
		t.Fatalf("/readyz after the spool was drained answered %d %q", c.status, c.body)
	}
}

func get(t *testing.T, h http.Handler, path string) call {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, path, nil)
	rec := &recorder{header: http.Header{}}
	h.ServeHTTP(rec, req)
	return call{rec.status, rec.buf.String(), rec.header}
}

// TestRefusedBadInputNamesTheProblem: a body that is JSON but not a v1
// EventList gets a 400 whose text says what is wrong, and nothing of it is
// spooled (checked in TestHandlerContract).
func TestRefusedBadInputNamesTheProblem(t *testing.T) {
	events := audittest.Events(t)
	bearer := map[string]string{"Authorization": "Bearer t"}
	for body, want := range map[string]string{
		events[0]: `kind "Event": a single audit Event, not an EventList`,
		`{"auditID":"x","stage":"ResponseComplete"}`:                                    "a single audit Event without the EventList wrapper",
		`{"kind":"Pod","apiVersion":"audit.k8s.io/v1","items":[]}`:                      `kind "Pod"`,
		`{"kind":"EventList","apiVersion":"audit.k8s.io/v1beta1","items":[]}`:           `"audit.k8s.io/v1beta1" is not read`,
		`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{"a":1}}`:           "items is an object, not an array",
		`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{"resource":1}}`: "no items",
	} {
		h, _ := newSpoolHandler(t, HandlerOptions{Token: "t"}, 0)
		if c := post(t, h, "/clusters/prod/events", body, bearer); c.status != 400 || !strings.Contains(c.body, want) {
			t.Errorf("%.60s: %d %q, want 400 naming %q", body, c.status, c.body, want)
		}
	}
}

// TestMetricsCountAcceptedEventsOnceAndRefusalsByReason: a batch refused
// with 503 three times and then stored counts its events once as
// accepted, and the three refusals as spool_full.
func TestMetricsCountAcceptedEventsOnceAndRefusalsByReason(t *testing.T) {
	events := audittest.Events(t)
	bearer := map[string]string{"Authorization": "Bearer t"}
	reg := prometheus.NewRegistry()
	m := pipeline.NewMetrics(reg)
	h, sp := newSpoolHandler(t, HandlerOptions{Token: "t", Metrics: m}, 64<<10)
	body := eventList(events...)
	for post(t, h, "/clusters/prod/events", body, bearer).status == 200 {
	}
	accepted := testutil.ToFloat64(m.Accepted.WithLabelValues("webhook"))
	conflicts := seriesValue(t, reg, "auditsink_conflicts_total", "version", "prod", "configmaps", "team-a")
	for range 2 {
		if c := post(t, h, "/clusters/prod/events", body, bearer); c.status != 503 {
			t.Fatalf("the full spool answered %d", c.status)
		}
	}
	// Drain the spool, as the writer would, and send the batch again.
	for sp.Stats().RecordsPending > 0 {
		b, err := sp.Next(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := sp.Confirm(b.End); err != nil {
			t.Fatal(err)
		}
	}
	if c := post(t, h, "/clusters/prod/events", body, bearer); c.status != 200 {
		t.Fatalf("after draining: %d %s", c.status, c.body)
	}
	if got := testutil.ToFloat64(m.Accepted.WithLabelValues("webhook")) - accepted; got != 10 {
		t.Errorf("accepted grew by %v for one batch of 10 stored events after 3 refusals", got)
	}
	if got := testutil.ToFloat64(m.BatchesRefused.WithLabelValues(pipeline.RefusedSpoolFull)); got != 3 {
		t.Errorf("batches refused as spool_full: %v, want 3", got)
	}
	// The batch holds one version conflict: counted with its 200 only.
	if got := seriesValue(t, reg, "auditsink_conflicts_total", "version", "prod", "configmaps", "team-a") - conflicts; got != 1 {
		t.Errorf("version conflicts grew by %v for one stored batch with one conflict after 3 refusals, want 1", got)
	}
	post(t, h, "/clusters/prod/events", body, nil)
	post(t, h, "/clusters/prod/events", events[0], bearer)
	for reason, want := range map[string]float64{pipeline.RefusedUnauthorized: 1, pipeline.RefusedBadRequest: 1} {
		if got := testutil.ToFloat64(m.BatchesRefused.WithLabelValues(reason)); got != want {
			t.Errorf("batches refused as %s: %v, want %v", reason, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "auditsink_events_received_total"); err != nil || n != 0 {
		t.Errorf("auditsink_events_received_total still exported (%d series, %v): it counted every retry", n, err)
	}
}

func TestNewHandlerRefusesNoAuthentication(t *testing.T) {
	sp, err := spool.Open(t.TempDir(), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if _, err := NewHandler(HandlerOptions{Spool: sp, Accepter: &pipeline.Accepter{}}); err == nil {
		t.Fatal("a handler without authentication was built")
	}
}

func TestRunRefusesPlaintextUnlessAsked(t *testing.T) {
	err := Run(t.Context(), Options{SpoolDir: t.TempDir(), Token: "t", Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("Run without TLS files: %v", err)
	}
}

// startSink runs the whole serve pipeline against a real ClickHouse and
// returns its base URL.
func startSink(t *testing.T, o Options) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	addr := make(chan net.Addr, 1)
	o.Ready = func(a net.Addr) { addr <- a }
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	select {
	case a := <-addr:
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		scheme := "https"
		if o.Plaintext {
			scheme = "http"
		}
		return scheme + "://" + a.String(), stop
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("sink did not start")
	}
	return "", nil
}

func countEvents(t *testing.T, srv *chtest.Server, db string) uint64 {
	t.Helper()
	n, err := tryCountEvents(t, srv.Conn(t, db))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func tryCountEvents(t *testing.T, conn driver.Conn) (uint64, error) {
	var n uint64
	err := conn.QueryRow(t.Context(), "SELECT count() FROM events_by_hour").Scan(&n)
	return n, err
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServeOverTLSWithClientCertificatesStoresInClickHouse: a client
// certificate of the client CA suffices, and so does the token with a
// certificate of another CA (a CA rotation) or none; POST /events stores
// into cluster "default" without a configured cluster.
func TestServeOverTLSWithClientCertificatesStoresInClickHouse(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	ch := chtest.Start(t)
	db := ch.NewDatabase(t)
	ca, otherCA := pkitest.NewCA("test-ca"), pkitest.NewCA("other-ca")
	pkiDir, spoolDir := t.TempDir(), t.TempDir()
	certFile, keyFile := ca.Server("auditsink", "127.0.0.1").WriteFiles(t, pkiDir)
	apiserver, stranger := ca.Client("kube-apiserver"), otherCA.Client("kube-apiserver")
	opts := Options{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: ca.WriteFile(t, pkiDir), Token: "tok",
		ClientNames: map[string][]string{"kube-apiserver": nil},
		Store:       store.Options{DSN: ch.DSN(), Database: db}, SpoolDir: spoolDir}
	url, stop := startSink(t, opts)

	events := audittest.Events(t)
	client := func(cert *pkitest.Cert) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig(cert)}, Timeout: 10 * time.Second}
	}
	send := func(c *http.Client, path, token string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, strings.NewReader(eventList(events...)))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		what   string
		cert   *pkitest.Cert
		token  string
		path   string
		status int
	}{
		{"without a client certificate or token", nil, "", "/clusters/prod/events", 401},
		{"with a certificate of another CA and no token", stranger, "", "/clusters/prod/events", 401},
		{"with a client certificate", apiserver, "", "/clusters/prod/events", 200},
		{"redelivered by the apiserver", apiserver, "", "/clusters/prod/events", 200},
		{"with a certificate of another CA and the token (a CA rotation)", stranger, "tok", "/events", 200},
		{"with the token alone", nil, "tok", "/events", 200},
	} {
		if got := send(client(c.cert), c.path, c.token); got != c.status {
			t.Fatalf("%s: %d, want %d", c.what, got, c.status)
		}
	}
	conn := ch.Conn(t, db)
	waitFor(t, "20 events in ClickHouse", func() bool {
		// The writer creates the tables in the background, after the
		// 200s: until then the query fails.
		n, err := tryCountEvents(t, conn)
		return err == nil && n == 20
	})
	var n uint64
	if err := conn.QueryRow(t.Context(), "SELECT count() FROM events_by_hour WHERE cluster = 'default'").Scan(&n); err != nil || n != 10 {
		t.Fatalf("%d events of cluster default (%v), want the 10 posted to /events", n, err)
	}
	stop()
	// A restart with the same spool replays nothing new and doubles nothing.
	_, stop = startSink(t, opts)
	time.Sleep(500 * time.Millisecond)
	stop()
	if n := countEvents(t, ch, db); n != 20 {
		t.Fatalf("%d events after restart, want 20", n)
	}
}

// slowClient sends a POST's headers and then one byte of body every
// interval; it returns the connection and a channel closed when a write
// fails (the sink cut the connection).
func slowClient(t *testing.T, addr, path string, interval time.Duration) (net.Conn, chan struct{}) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: sink\r\nAuthorization: Bearer t\r\nContent-Length: 1000000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		for {
			time.Sleep(interval)
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	return conn, cut
}

// TestASlowBodyIsCut: a client that sends its body below the minimum rate
// is answered 408 and its connection closed, and the refusal is counted.
func TestASlowBodyIsCut(t *testing.T) {
	reg := prometheus.NewRegistry()
	url, _ := startSink(t, Options{Plaintext: true, Token: "t", SpoolDir: t.TempDir(), Registry: reg,
		Store:     store.Options{DSN: "clickhouse://127.0.0.1:1"}, // never reached: nothing is stored
		BodyGrace: 300 * time.Millisecond, BodyMinRate: 1024})
	conn, _ := slowClient(t, strings.TrimPrefix(url, "http://"), "/clusters/prod/events", 100*time.Millisecond)
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	answer, err := io.ReadAll(conn) // until the sink closes the connection
	if err != nil {
		t.Fatalf("the slow connection was not closed: %v (read %q)", err, answer)
	}
	if !strings.HasPrefix(string(answer), "HTTP/1.1 408") || !strings.Contains(string(answer), "too slowly") {
		t.Fatalf("answer %q, want a 408 saying the body came too slowly", answer)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var refused float64
	for _, mf := range mfs {
		if mf.GetName() == "auditsink_batches_refused_total" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == pipeline.RefusedTooSlow {
					refused = m.GetCounter().GetValue()
				}
			}
		}
	}
	if refused != 1 {
		t.Errorf("batches refused as too_slow: %v, want 1", refused)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAShutdownThatHitsItsDeadlineIsLogged: a connection that never sends
// its request holds the server's shutdown; Run gives up at ShutdownTimeout,
// closes it, says so, and returns without error.
func TestAShutdownThatHitsItsDeadlineIsLogged(t *testing.T) {
	var logs syncBuffer
	url, stop := startSink(t, Options{Plaintext: true, Token: "t", SpoolDir: t.TempDir(),
		Store:           store.Options{DSN: "clickhouse://127.0.0.1:1"}, // never reached: nothing is stored
		ShutdownTimeout: time.Second, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The server accepts connections in order: once a later one is
	// answered, the server holds the silent one above, which a shutdown
	// must then wait for (a stop racing its accept found no connection).
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	start := time.Now()
	stop() // fails the test if Run returns an error
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %s with a 1s timeout", took)
	}
	if out := logs.String(); !strings.Contains(out, "shutdown hit its deadline") {
		t.Errorf("no log of the shutdown deadline:\n%s", out)
	}
}

// seriesValue is the value of the series of name whose label values
// include all of values (0 if there is none).
func seriesValue(t *testing.T, reg *prometheus.Registry, name string, values ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]bool{}
			for _, l := range m.GetLabel() {
				have[l.GetValue()] = true
			}
			for _, v := range values {
				if !have[v] {
					continue series
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// A token bound to clusters writes those and gets 403 elsewhere, before
// anything is spooled; /events is the default cluster's path.
func TestATokenBoundToClusters(t *testing.T) {
	events := audittest.Events(t)
	h, sp := newSpoolHandler(t, HandlerOptions{Token: "s3cret", TokenClusters: []string{"dev"}, DefaultCluster: "prod"}, 0)
	bearer := map[string]string{"Authorization": "Bearer s3cret"}
	for path, want := range map[string]int{"/clusters/dev/events": 200, "/clusters/prod/events": 403, "/events": 403} {
		if c := post(t, h, path, eventList(events[:1]...), bearer); c.status != want {
			t.Errorf("%s: %d %s, want %d", path, c.status, c.body, want)
		}
	}
	if n := sp.Stats().RecordsPending; n != 1 {
		t.Errorf("%d records spooled, want the one of dev", n)
	}
}

func TestClientCertificatesNeedAnAllowList(t *testing.T) {
	sp, err := spool.Open(t.TempDir(), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	verify := func([]*x509.Certificate) error { return nil }
	for what, o := range map[string]HandlerOptions{
		"no names":            {VerifyClient: verify},
		"a bad cluster":       {VerifyClient: verify, ClientNames: map[string][]string{"a": {"../x"}}},
		"a bad token cluster": {Token: "t", TokenClusters: []string{""}},
	} {
		o.Spool, o.Accepter = sp, &pipeline.Accepter{}
		if _, err := NewHandler(o); err == nil {
			t.Errorf("%s: NewHandler accepted %+v", what, o)
		}
	}
}
