package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// open opens a spool in dir and closes it at cleanup.
func open(t testing.TB, dir string, opts Options) *Spool {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	sp, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

// testWriter sends log output to t.Log so warnings show with the test.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// batch makes n records named "<name>/<i>" padded to size bytes.
func batch(name string, n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		r := fmt.Appendf(nil, "%s/%d;", name, i)
		for len(r) < size {
			r = append(r, byte('a'+len(r)%26))
		}
		out[i] = r
	}
	return out
}

func mustAppend(t testing.TB, sp *Spool, recs [][]byte) Position {
	t.Helper()
	pos, err := sp.Append(recs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return pos
}

// drain reads everything already in the spool without blocking.
func drain(t testing.TB, sp *Spool) ([][]byte, Position) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // Next still returns data that is there; it only won't wait
	var all [][]byte
	var end Position
	for {
		b, err := sp.Next(ctx, 1000)
		if errors.Is(err, context.Canceled) {
			return all, end
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		all = append(all, b.Records...)
		end = b.End
	}
}

func equalRecords(t testing.TB, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d = %.40q, want %.40q", i, got[i], want[i])
		}
	}
}

func segFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAppendNextConfirm(t *testing.T) {
	dir := t.TempDir()
	sp := open(t, dir, Options{})
	a, b, c := batch("a", 3, 10), batch("b", 1, 0), batch("c", 5, 100)
	p1 := mustAppend(t, sp, a)
	p2 := mustAppend(t, sp, b)
	p3 := mustAppend(t, sp, c)
	if !p1.Less(p2) || !p2.Less(p3) {
		t.Fatalf("positions not increasing: %v %v %v", p1, p2, p3)
	}
	if got := sp.Stats().RecordsPending; got != 9 {
		t.Fatalf("RecordsPending = %d, want 9", got)
	}

	// maxRecords 3 stops after the first batch; the next call merges.
	first, err := sp.Next(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	equalRecords(t, first.Records, a)
	if first.End != p1 {
		t.Fatalf("End = %v, want %v", first.End, p1)
	}
	rest, end := drain(t, sp)
	equalRecords(t, rest, slices.Concat(b, c))
	if end != p3 {
		t.Fatalf("End = %v, want %v", end, p3)
	}

	if err := sp.Confirm(first.End); err != nil {
		t.Fatal(err)
	}
	if got := sp.Stats().RecordsPending; got != 6 {
		t.Fatalf("RecordsPending after confirming 3 = %d, want 6", got)
	}
	if err := sp.Confirm(end); err != nil {
		t.Fatal(err)
	}
	if got := sp.Stats().RecordsPending; got != 0 {
		t.Fatalf("RecordsPending after confirming all = %d, want 0", got)
	}
}

func TestEmptyAndZeroLengthRecords(t *testing.T) {
	sp := open(t, t.TempDir(), Options{})
	if _, err := sp.Append(nil); err != nil {
		t.Fatalf("Append(nil): %v", err)
	}
	want := [][]byte{{}, []byte("x"), {}}
	mustAppend(t, sp, want)
	got, _ := drain(t, sp)
	equalRecords(t, got, want)
}

func TestConfirmRejectsPositionsNotHandedOut(t *testing.T) {
	sp := open(t, t.TempDir(), Options{})
	p1 := mustAppend(t, sp, batch("a", 1, 10))
	mustAppend(t, sp, batch("b", 1, 10))
	if err := sp.Confirm(p1); err == nil {
		t.Fatal("Confirm of an unread position succeeded")
	}
	b, err := sp.Next(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Confirm(Position{Segment: b.End.Segment, Offset: b.End.Offset - 1}); err == nil {
		t.Fatal("Confirm of a position inside a batch succeeded")
	}
	if err := sp.Confirm(b.End); err != nil {
		t.Fatal(err)
	}
}

func TestRestartReplaysUnconfirmed(t *testing.T) {
	dir := t.TempDir()
	sp, err := Open(dir, Options{SegmentBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var all [][]byte
	for i := range 20 {
		recs := batch(fmt.Sprint("b", i), 3, 500)
		mustAppend(t, sp, recs)
		all = append(all, recs...)
	}
	b, err := sp.Next(t.Context(), 30)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Confirm(b.End); err != nil {
		t.Fatal(err)
	}
	// Read further without confirming: a restart must replay it.
	if _, err := sp.Next(t.Context(), 9); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}

	sp2 := open(t, dir, Options{SegmentBytes: 4 << 10})
	if got, want := sp2.Stats().RecordsPending, int64(len(all)-len(b.Records)); got != want {
		t.Fatalf("RecordsPending after restart = %d, want %d", got, want)
	}
	got, end := drain(t, sp2)
	equalRecords(t, got, all[len(b.Records):])

	// Appends after a restart go on in order.
	more := batch("after", 2, 10)
	mustAppend(t, sp2, more)
	got, end2 := drain(t, sp2)
	equalRecords(t, got, more)
	if !end.Less(end2) {
		t.Fatalf("position went backwards after restart: %v then %v", end, end2)
	}
}

func TestConfirmedSegmentsAreDeleted(t *testing.T) {
	dir := t.TempDir()
	sp := open(t, dir, Options{SegmentBytes: 2 << 10})
	for i := range 10 {
		mustAppend(t, sp, batch(fmt.Sprint(i), 2, 600))
	}
	if n := len(segFiles(t, dir)); n < 5 {
		t.Fatalf("%d segments, want one per batch or so", n)
	}
	if got := sp.Stats().Segments; got != len(segFiles(t, dir)) {
		t.Fatalf("Stats().Segments = %d, files %d", got, len(segFiles(t, dir)))
	}
	_, end := drain(t, sp)
	if err := sp.Confirm(end); err != nil {
		t.Fatal(err)
	}
	// The active segment too: once all of it is confirmed and nothing is
	// being appended, its space no longer counts against MaxBytes.
	if files := segFiles(t, dir); len(files) != 0 {
		t.Fatalf("segments after confirming all: %v", files)
	}
	st := sp.Stats()
	if st.Segments != 0 || st.RecordsPending != 0 || st.BytesOnDisk != 0 {
		t.Fatalf("Stats after confirming all = %+v", st)
	}
	// Appends go on in a new segment, and a restart replays only them.
	mustAppend(t, sp, batch("after", 2, 600))
	files := segFiles(t, dir)
	if fi, err := os.Stat(files[0]); len(files) != 1 || err != nil || fi.Size() != sp.Stats().BytesOnDisk {
		t.Fatalf("after one more append: files %v, BytesOnDisk %d (%v)", files, sp.Stats().BytesOnDisk, err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	sp = open(t, dir, Options{SegmentBytes: 2 << 10})
	if got, _ := drain(t, sp); len(got) != 2 || !bytes.HasPrefix(got[0], []byte("after/")) {
		t.Fatalf("replayed %d records after restart, want the 2 appended after the confirm", len(got))
	}
}

func TestStatsFollowEveryAppendAndConfirm(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var seen []Stats
	opts := Options{SegmentBytes: 2 << 10, Observe: func(st Stats) {
		mu.Lock()
		seen = append(seen, st)
		mu.Unlock()
	}}
	last := func() Stats {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			return Stats{}
		}
		return seen[len(seen)-1]
	}
	sp := open(t, dir, opts)
	if st := sp.Stats(); !st.OldestUnconfirmed.IsZero() {
		t.Fatalf("an empty spool has an oldest unconfirmed record: %+v", st)
	}
	before := time.Now()
	mustAppend(t, sp, batch("a", 2, 600))
	mustAppend(t, sp, batch("b", 2, 600))
	st := sp.Stats()
	if last() != st {
		t.Fatalf("Observe saw %+v after the appends, Stats is %+v", last(), st)
	}
	if st.BytesOnDisk == 0 || st.OldestUnconfirmed.Before(before.Add(-time.Second)) || st.OldestUnconfirmed.After(time.Now()) {
		t.Fatalf("after two appends: %+v (appended from %s)", st, before)
	}
	_, end := drain(t, sp)
	if err := sp.Confirm(end); err != nil {
		t.Fatal(err)
	}
	if st := last(); st.BytesOnDisk != 0 || st.RecordsPending != 0 || !st.OldestUnconfirmed.IsZero() {
		t.Fatalf("Observe after confirming all: %+v", st)
	}
	// After a restart the unconfirmed data is dated by its segment file.
	mustAppend(t, sp, batch("c", 2, 600))
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, f := range segFiles(t, dir) {
		if err := os.Chtimes(f, old, old); err != nil {
			t.Fatal(err)
		}
	}
	sp = open(t, dir, opts)
	if got := sp.Stats().OldestUnconfirmed; got.After(old.Add(time.Second)) || got.Before(old.Add(-time.Second)) {
		t.Fatalf("after reopening, the oldest unconfirmed record is from %s, want about %s", got, old)
	}
	if last() != sp.Stats() {
		t.Fatalf("Observe after Open saw %+v, Stats is %+v", last(), sp.Stats())
	}
}

func TestFullSpoolRefusesAndRecovers(t *testing.T) {
	dir := t.TempDir()
	sp := open(t, dir, Options{SegmentBytes: 8 << 10, MaxBytes: 32 << 10})
	var n int
	var err error
	for ; n < 100; n++ {
		if _, err = sp.Append(batch(fmt.Sprint(n), 4, 1000)); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrFull) {
		t.Fatalf("after %d batches: err = %v, want ErrFull", n, err)
	}
	if st := sp.Stats(); st.BytesOnDisk > 32<<10 {
		t.Fatalf("BytesOnDisk %d over MaxBytes", st.BytesOnDisk)
	}
	if _, err := sp.Append(batch("huge", 1, 40<<10)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized batch: err = %v, want ErrTooLarge", err)
	}
	got, end := drain(t, sp)
	if len(got) != 4*n {
		t.Fatalf("read %d records, want %d", len(got), 4*n)
	}
	if err := sp.Confirm(end); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Append(batch("again", 4, 1000)); err != nil {
		t.Fatalf("Append after draining a full spool: %v", err)
	}
}

func TestNextWaitsForAppendAndStopsOnClose(t *testing.T) {
	sp := open(t, t.TempDir(), Options{})
	got := make(chan Batch)
	go func() {
		b, err := sp.Next(t.Context(), 10)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	want := batch("late", 2, 10)
	mustAppend(t, sp, want)
	equalRecords(t, (<-got).Records, want)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := sp.Next(ctx, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a done context on an empty spool: %v", err)
	}
	// With records to hand over, a done context does not stop Next: the
	// Drainer takes what is there this way (pipeline.Source).
	held := batch("held", 3, 10)
	mustAppend(t, sp, held)
	if b, err := sp.Next(ctx, 10); err != nil {
		t.Fatalf("Next with a done context on a spool holding records: %v", err)
	} else {
		equalRecords(t, b.Records, held)
	}

	errc := make(chan error)
	go func() {
		_, err := sp.Next(t.Context(), 10)
		errc <- err
	}()
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked Next after Close: %v, want ErrClosed", err)
	}
	if _, err := sp.Append(want); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v, want ErrClosed", err)
	}
}

func TestRewindRereadsUnconfirmed(t *testing.T) {
	sp := open(t, t.TempDir(), Options{})
	a, b := batch("a", 2, 10), batch("b", 2, 10)
	mustAppend(t, sp, a)
	mustAppend(t, sp, b)
	first, err := sp.Next(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Confirm(first.End); err != nil {
		t.Fatal(err)
	}
	drain(t, sp)
	sp.rewind()
	got, _ := drain(t, sp)
	equalRecords(t, got, b)
}

func TestConcurrentAppendsKeepEveryRecordOnce(t *testing.T) {
	dir := t.TempDir()
	sp := open(t, dir, Options{SegmentBytes: 64 << 10})
	const writers, perWriter = 8, 40
	total := writers * perWriter * 3

	seen := make(map[string]int)
	readDone := make(chan error)
	go func() {
		n := 0
		for n < total {
			b, err := sp.Next(t.Context(), 50)
			if err != nil {
				readDone <- err
				return
			}
			for _, r := range b.Records {
				seen[string(r)]++
			}
			n += len(b.Records)
			if err := sp.Confirm(b.End); err != nil {
				readDone <- err
				return
			}
		}
		readDone <- nil
	}()

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				if _, err := sp.Append(batch(fmt.Sprintf("w%d-%d", w, i), 3, 300)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	if len(seen) != total {
		t.Fatalf("saw %d distinct records, want %d", len(seen), total)
	}
	for r, n := range seen {
		if n != 1 {
			t.Fatalf("record %.30q seen %d times", r, n)
		}
	}
	if st := sp.Stats(); st.RecordsPending != 0 {
		t.Fatalf("RecordsPending = %d after confirming everything", st.RecordsPending)
	}
}

func TestAppendOrderIsReadOrder(t *testing.T) {
	// Batches of one appender come back in its order, even with others
	// appending concurrently into the same commit groups.
	sp := open(t, t.TempDir(), Options{NoSync: true})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				if _, err := sp.Append([][]byte{fmt.Appendf(nil, "%d:%d", w, i)}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got, _ := drain(t, sp)
	next := map[int]int{}
	for _, r := range got {
		var w, i int
		if _, err := fmt.Sscanf(string(r), "%d:%d", &w, &i); err != nil {
			t.Fatal(err)
		}
		if i != next[w] {
			t.Fatalf("writer %d: got record %d, want %d", w, i, next[w])
		}
		next[w]++
	}
	if len(got) != 400 {
		t.Fatalf("read %d records, want 400", len(got))
	}
}

func TestSmallSpoolWithDefaultSegmentsRecoversFromFull(t *testing.T) {
	// Segments default to 64 MiB; a 64 KiB spool must still roll and
	// delete them, or one confirmed segment would keep it full for ever.
	sp := open(t, t.TempDir(), Options{MaxBytes: 64 << 10})
	for round := range 3 {
		var err error
		for err == nil {
			_, err = sp.Append(batch(fmt.Sprint(round), 4, 1000))
		}
		if !errors.Is(err, ErrFull) {
			t.Fatalf("round %d: %v, want ErrFull", round, err)
		}
		_, end := drain(t, sp)
		if err := sp.Confirm(end); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOneSpoolPerDirectory(t *testing.T) {
	dir := t.TempDir()
	sp := open(t, dir, Options{})
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Open: %v, want ErrInUse", err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	sp2, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	sp2.Close()
}
