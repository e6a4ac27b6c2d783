package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stampguard/stampguard/test/chtest"
)

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

// TestExactWithSinkLeftDown: `serve` is SIGKILLed after ClickHouse stored
// its insert and before the insert returned (its spool unconfirmed), and
// left down: the figures are exact without it. Then what a user does: start
// serve again on the same --spool-dir; it stores its spool again, and the
// copies change nothing.
func TestExactWithSinkLeftDown(t *testing.T) {
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
