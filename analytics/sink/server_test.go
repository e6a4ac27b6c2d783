package sink

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/internal/chtest"

	"github.com/stampguard/stampguard/internal/testenv"
)

func realEvents(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile("../testdata/events.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

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
		o.Accepter = &analytics.Accepter{}
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
	events := realEvents(t)
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
	events := realEvents(t)
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

	h2, _ := newSpoolHandler(t, HandlerOptions{Token: "t"}, 0)
	h2.Drain()
	if c := post(t, h2, "/clusters/prod/events", body, bearer); c.status != 503 {
		t.Fatalf("a draining sink answered %d, want 503", c.status)
	}
}

func TestNewHandlerRefusesNoAuthentication(t *testing.T) {
	sp, err := spool.Open(t.TempDir(), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if _, err := NewHandler(HandlerOptions{Spool: sp, Accepter: &analytics.Accepter{}}); err == nil {
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
	var n uint64
	err := srv.Conn(t, db).QueryRow(t.Context(), "SELECT count() FROM events").Scan(&n)
	var ex *clickhouse.Exception
	if errors.As(err, &ex) && ex.Code == 60 {
		return 0 // the sink's writer has not migrated yet (UNKNOWN_TABLE)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
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

func TestServeOverTLSWithClientCertificatesStoresInClickHouse(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	ch := chtest.Start(t)
	db := ch.NewDatabase(t)
	pki := newPKI(t)
	spoolDir := t.TempDir()
	opts := Options{TLSCertFile: pki.ServerCert, TLSKeyFile: pki.ServerKey, ClientCAFile: pki.CAFile,
		Store: analytics.StoreOptions{DSN: ch.DSN(), Database: db}, SpoolDir: spoolDir}
	url, stop := startSink(t, opts)

	events := realEvents(t)
	client := func(cert bool) *http.Client {
		cfg := &tls.Config{RootCAs: pki.Pool}
		if cert {
			cfg.Certificates = []tls.Certificate{pki.Client}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	}
	send := func(c *http.Client) int {
		resp, err := c.Post(url+"/clusters/prod/events", "application/json", strings.NewReader(eventList(events...)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := send(client(false)); s != 401 {
		t.Fatalf("without a client certificate: %d, want 401", s)
	}
	if s := send(client(true)); s != 200 {
		t.Fatalf("with a client certificate: %d, want 200", s)
	}
	if s := send(client(true)); s != 200 { // the apiserver retrying the same batch
		t.Fatalf("redelivery: %d, want 200", s)
	}
	waitFor(t, "10 events in ClickHouse", func() bool { return countEvents(t, ch, db) == 10 })
	stop()
	// A restart with the same spool replays nothing new and doubles nothing.
	_, stop = startSink(t, opts)
	time.Sleep(500 * time.Millisecond)
	stop()
	if n := countEvents(t, ch, db); n != 10 {
		t.Fatalf("%d events after restart, want 10", n)
	}
}
