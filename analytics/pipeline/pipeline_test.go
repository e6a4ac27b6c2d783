package pipeline

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// acceptInto splits an EventList body and appends its records to sp.
func acceptInto(t *testing.T, sp *spool.Spool, cluster, body string) AcceptResult {
	t.Helper()
	a := Accepter{Decoder: audit.Decoder{KeepRaw: true}}
	res, err := a.Accept(cluster, "webhook", audit.NewListReader(strings.NewReader(body), 0), func(rec []byte) error {
		_, err := sp.Append([][]byte{rec})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// drain runs a writer until the spool has nothing pending.
func drain(t *testing.T, sp *spool.Spool, st Inserter) {
	t.Helper()
	drainWith(t, sp, st, DrainerOptions{})
}

func drainWith(t *testing.T, sp *spool.Spool, st Inserter, o DrainerOptions) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	o.Backoff = Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	go func() { done <- NewDrainer(sp, st, o).Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for sp.Stats().RecordsPending > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("spool still has %d records pending", sp.Stats().RecordsPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func openSpool(t *testing.T, dir string) *spool.Spool {
	t.Helper()
	sp, err := spool.Open(dir, spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

func TestAcceptKeepsStagesAndDeadLettersInvalidNeighbours(t *testing.T) {
	events := audittest.Events(t)
	body := eventList(events[0], `{"stage":"ResponseComplete"}`, events[9], `{"auditID":"s","stage":"Panic","stageTimestamp":"x","objectRef":{"resource":"secrets"},"requestObject":{"data":{"k":"c2VjcmV0"}}}`, events[1])
	var recs [][]byte
	a := Accepter{}
	res, err := a.Accept("prod", "webhook", audit.NewListReader(strings.NewReader(body), 0), func(rec []byte) error {
		recs = append(recs, append([]byte(nil), rec...))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res != (AcceptResult{Accepted: 2, Rejected: 2, Skipped: 1}) {
		t.Fatalf("result %+v", res)
	}
	var set record.Set
	if err := set.Add(string(recs[0])); err != nil {
		t.Fatal(err)
	}
	dead := set.Dead()
	if set.Rows() != 2 || len(dead) != 2 || dead[0].Cluster != "prod" {
		t.Fatalf("record: %d rows, %d dead", set.Rows(), len(dead))
	}
	if dead[0].Reason != audit.ErrMissingAuditID.Error() || dead[0].Raw != `{"stage":"ResponseComplete"}` {
		t.Errorf("first dead letter %+v", dead[0])
	}
	if strings.Contains(dead[1].Raw, "c2VjcmV0") {
		t.Errorf("a dead-lettered secret kept its data: %q", dead[1].Raw)
	}
}

func TestAcceptSplitsRecordsByRowsAndBytes(t *testing.T) {
	events := audittest.Events(t)
	body := eventList(append(append([]string{}, events...), events...)...)
	tests := []struct {
		name       string
		accepter   Accepter
		wantChunks int
	}{
		{"all rows of a small body fit one record", Accepter{}, 1},
		{"a row cap of 4 cuts 20 rows into 5 records", Accepter{RecordRows: 4}, 5},
		{"a byte cap below one row makes a record per row", Accepter{RecordBytes: 10, Decoder: audit.Decoder{KeepRaw: true}}, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var chunks, rows int
			_, err := tt.accepter.Accept("prod", "webhook", audit.NewListReader(strings.NewReader(body), 0), func(rec []byte) error {
				var set record.Set
				if err := set.Add(string(rec)); err != nil {
					return err
				}
				chunks++
				rows += set.Rows()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if chunks != tt.wantChunks || rows != 20 {
				t.Errorf("%d records with %d rows, want %d records with 20", chunks, rows, tt.wantChunks)
			}
		})
	}
}

func TestWriterStoresSpooledEventsExactlyOnce(t *testing.T) {
	st, _ := newStore(t, false)
	dir := t.TempDir()
	sp := openSpool(t, dir)
	events := audittest.Events(t)
	body := eventList(events...)
	want := uint64(acceptInto(t, sp, "prod", body).Accepted)
	drain(t, sp, st)
	if n := count(t, st, distinctEventsSQL); n != want {
		t.Fatalf("%d events stored, want %d", n, want)
	}

	t.Run("a redelivered batch (apiserver retry) adds nothing", func(t *testing.T) {
		acceptInto(t, sp, "prod", body)
		drain(t, sp, st)
		if n := count(t, st, distinctEventsSQL); n != want {
			t.Fatalf("%d events, want %d", n, want)
		}
	})
	t.Run("the same batch twice in concurrent inserts is stored once", func(t *testing.T) {
		for range 3 {
			acceptInto(t, sp, "concurrent", body)
		}
		drainWith(t, sp, st, DrainerOptions{MaxRecords: 1, Parallel: 3})
		if n := count(t, st, distinctEventsSQL+" WHERE cluster = 'concurrent'"); n != want {
			t.Fatalf("%d events, want %d", n, want)
		}
	})
	t.Run("a crash between insert and confirm replays without doubling", func(t *testing.T) {
		acceptInto(t, sp, "other", body)
		b, err := sp.Next(t.Context(), 100)
		if err != nil {
			t.Fatal(err)
		}
		set := record.NewSet(0)
		for _, rec := range b.Records {
			if err := set.Add(string(rec)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.InsertRecords(t.Context(), set); err != nil {
			t.Fatal(err)
		}
		sp.Close() // no Confirm: the "crash"
		sp2 := openSpool(t, dir)
		if sp2.Stats().RecordsPending == 0 {
			t.Fatal("the unconfirmed record was not replayed")
		}
		drain(t, sp2, st)
		if n := count(t, st, distinctEventsSQL+" WHERE cluster = 'other'"); n != want {
			t.Fatalf("%d events for the replayed cluster, want %d", n, want)
		}
	})
}

func TestWriterWaitsOutClickHouseDowntime(t *testing.T) {
	st, srv := newStore(t, false)
	sp := openSpool(t, t.TempDir())
	m := NewMetrics(nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- NewDrainer(sp, st, DrainerOptions{Metrics: m, Backoff: Backoff{Min: 50 * time.Millisecond, Max: 300 * time.Millisecond}}).Run(ctx)
	}()

	srv.Stop()
	want := uint64(acceptInto(t, sp, "prod", eventList(audittest.Events(t)...)).Accepted)
	time.Sleep(time.Second)
	if sp.Stats().RecordsPending == 0 {
		t.Fatal("records were confirmed while ClickHouse was down")
	}
	srv.Start()
	deadline := time.Now().Add(60 * time.Second)
	for sp.Stats().RecordsPending > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := count(t, st, distinctEventsSQL); n != want {
		t.Fatalf("%d events after ClickHouse returned, want %d", n, want)
	}
	if got := testutilValue(m.CHErrors.WithLabelValues(OpInsert)); got < 1 {
		t.Errorf("clickhouse error counter %v, want >= 1", got)
	}
}

// blockingInserter holds each insert until release is closed, or fails it
// when its ctx is done first.
type blockingInserter struct {
	started chan struct{}
	release chan struct{}
}

func (b *blockingInserter) InsertRecords(ctx context.Context, set *record.Set) (store.InsertResult, error) {
	close(b.started)
	select {
	case <-b.release:
		return store.InsertResult{Stored: set.Rows()}, nil
	case <-ctx.Done():
		return store.InsertResult{}, ctx.Err()
	}
}

// TestDrainerFinishLetsTheInsertInFlightEnd: at shutdown an insert in
// flight, with its check for concurrent copies, ends and is confirmed
// with Finish; without it, it is cancelled and its record stays
// unconfirmed (to replay).
func TestDrainerFinishLetsTheInsertInFlightEnd(t *testing.T) {
	a := Accepter{Decoder: audit.Decoder{KeepRaw: true}}
	var rec []byte
	body := `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[` + strings.Join(audittest.Events(t)[:5], ",") + `]}`
	if _, err := a.Accept("c", "webhook", audit.NewListReader(strings.NewReader(body), 0), func(r []byte) error {
		rec = append([]byte(nil), r...)
		return nil
	}); err != nil || rec == nil {
		t.Fatalf("accept: %v", err)
	}
	for _, finish := range []bool{true, false} {
		var confirmed []any
		q := NewQueue(1<<20, func(m any) error { confirmed = append(confirmed, m); return nil })
		if err := q.Append(t.Context(), rec, "mark"); err != nil {
			t.Fatal(err)
		}
		st := &blockingInserter{started: make(chan struct{}), release: make(chan struct{})}
		o := DrainerOptions{Linger: -1, Backoff: Backoff{Min: time.Millisecond, Max: time.Millisecond}}
		fin, stopFin := context.WithCancel(t.Context())
		if finish {
			o.Finish = fin
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- NewDrainer(q, st, o).Run(ctx) }()
		<-st.started
		cancel() // shutdown while the insert is in flight
		if finish {
			select {
			case err := <-done:
				t.Fatalf("with Finish, Run returned (%v) before the insert in flight ended", err)
			case <-time.After(100 * time.Millisecond):
			}
		} else if err := <-done; err != nil { // returns without the release
			t.Fatal(err)
		}
		close(st.release)
		if finish {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		stopFin()
		if want := map[bool]int{true: 1, false: 0}[finish]; len(confirmed) != want {
			t.Errorf("finish %v: %d records confirmed, want %d", finish, len(confirmed), want)
		}
	}
}

// watchedSource reports each Next call's context to calls before it
// reads.
type watchedSource struct {
	*Queue
	calls chan context.Context
}

func (s watchedSource) Next(ctx context.Context, maxRecords int) (spool.Batch, error) {
	s.calls <- ctx
	return s.Queue.Next(ctx, maxRecords)
}

// recordingInserter sends the rows of each insert to rows.
type recordingInserter struct{ rows chan int }

func (r recordingInserter) InsertRecords(_ context.Context, set *record.Set) (store.InsertResult, error) {
	r.rows <- set.Rows()
	return store.InsertResult{Stored: set.Rows()}, nil
}

// TestLingerWaitsOnlyWhileTheBatchIsSmall: a read smaller than Enough
// waits for more records (a trickle becomes one insert); once it holds
// Enough it takes only what the source already has, and is inserted
// without waiting out the Linger.
func TestLingerWaitsOnlyWhileTheBatchIsSmall(t *testing.T) {
	a := Accepter{Decoder: audit.Decoder{KeepRaw: true}}
	var rec []byte
	body := `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[` + strings.Join(audittest.Events(t)[:5], ",") + `]}`
	if _, err := a.Accept("c", "webhook", audit.NewListReader(strings.NewReader(body), 0), func(r []byte) error {
		rec = append([]byte(nil), r...)
		return nil
	}); err != nil || rec == nil {
		t.Fatalf("accept: %v", err)
	}
	src := watchedSource{Queue: NewQueue(1<<20, nil), calls: make(chan context.Context)}
	st := recordingInserter{rows: make(chan int, 10)}
	// An hour's linger: were the drainer to wait it out, the test would
	// time out.
	d := NewDrainer(src, st, DrainerOptions{Linger: time.Hour, Enough: 2 * len(rec)})
	if err := src.Append(t.Context(), rec, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		go func() {
			for range src.calls { // Run's last reads, until it returns
			}
		}()
		if err := <-done; err != nil {
			t.Error(err)
		}
		close(src.calls)
	}()

	<-src.calls // the first read: one record
	lingering := <-src.calls
	if dl, ok := lingering.Deadline(); !ok || time.Until(dl) < time.Minute {
		t.Fatalf("with one record (under Enough) the drainer waited until %v, want a quarter of the linger", dl)
	}
	if err := src.Append(t.Context(), rec, nil); err != nil {
		t.Fatal(err)
	}
	if taking := <-src.calls; taking.Err() == nil {
		t.Fatal("with Enough records the drainer read with a context not yet done: it waits for more")
	}
	select {
	case rows := <-st.rows:
		if rows != 10 {
			t.Fatalf("the insert held %d rows, want the two records' 10", rows)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no insert: the drainer waited out the linger")
	}
}
