package pipeline

import (
	"compress/gzip"
	"context"
	"github.com/stampguard/stampguard/internal/audit/audittest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func writeLog(t *testing.T, path string, lines []string, gz bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := strings.Join(lines, "\n") + "\n"
	if gz {
		zw := gzip.NewWriter(f)
		if _, err := zw.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

func TestIngestingTheSameFilesTwiceStoresNothingTwice(t *testing.T) {
	st, _ := newStore(t, false)
	dir := t.TempDir()
	events := audittest.Events(t)
	plain, gz := filepath.Join(dir, "audit.log"), filepath.Join(dir, "audit-1.log.gz")
	writeLog(t, plain, events[:6], false)
	writeLog(t, gz, events[6:], true)
	o := IngestOptions{Cluster: "prod", Accepter: &Accepter{}}

	first, err := IngestFiles(t.Context(), st, []string{plain, gz}, o)
	if err != nil {
		t.Fatal(err)
	}
	if first.Stored != 10 || first.Skipped != 1 || first.Duplicates != 0 || first.Files != 2 {
		t.Fatalf("first ingest: %s", first)
	}
	again, err := IngestFiles(t.Context(), st, []string{gz, plain}, o)
	if err != nil {
		t.Fatal(err)
	}
	if again.Stored != 10 || again.Duplicates != 0 {
		t.Fatalf("second ingest: %s", again)
	}
	if n := count(t, st, distinctEventsSQL); n != 10 {
		t.Fatalf("%d events, want 10", n)
	}
	if !strings.Contains(again.String(), "10 events stored (an event stored before counts once), 0 repeated in a batch") {
		t.Errorf("summary %q", again.String())
	}
}

func TestTailFollowsRotationAndResumesExactlyOnce(t *testing.T) {
	st, _ := newStore(t, false)
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	cp := filepath.Join(dir, "checkpoint")
	// Distinct events: the real shapes with fresh audit IDs.
	var n int
	next := func(k int) []string {
		var out []string
		for range k {
			e := audittest.Events(t)[n%10]
			if strings.Contains(e, `"stage":"RequestReceived"`) {
				e = audittest.Events(t)[0]
			}
			out = append(out, strings.Replace(e, `"auditID":"`, `"auditID":"`+strconv.Itoa(n)+"-", 1))
			n++
		}
		return out
	}
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- Tail(ctx, st, path, TailOptions{Cluster: "prod", Accepter: &Accepter{}, CheckpointPath: cp,
				FlushInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		}()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Tail: %v", err)
			}
		}
	}
	waitCount := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for count(t, st, distinctEventsSQL) != want {
			if time.Now().After(deadline) {
				t.Fatalf("events = %d, want %d", count(t, st, distinctEventsSQL), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	writeLog(t, path, next(20), false)
	stop := run()
	waitCount(20)
	writeLog(t, path, next(5), false)
	if err := os.Rename(path, filepath.Join(dir, "audit-2026-11-29T09-00-00.000.log")); err != nil {
		t.Fatal(err)
	}
	writeLog(t, path, next(7), false)
	waitCount(32)
	stop()

	writeLog(t, path, next(8), false) // written while the tailer is down
	stop = run()
	waitCount(40)
	time.Sleep(300 * time.Millisecond)
	stop()
	if got := count(t, st, distinctEventsSQL); got != 40 {
		t.Fatalf("events = %d after restart, want 40", got)
	}
}
