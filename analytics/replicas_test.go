package analytics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/internal/chtest"
)

func TestCopiesInParts(t *testing.T) {
	for _, c := range []struct {
		name  string
		parts []string
		rows  []uint32
		want  uint32
	}{
		{"one part", []string{"20261201_3_3_0"}, []uint32{1}, 1},
		{"two inserts", []string{"20261201_3_3_0", "20261201_7_7_0"}, []uint32{1, 1}, 2},
		{"both copies merged", []string{"20261201_1_9_2"}, []uint32{2}, 2},
		// One replica merged blocks 1-5, the other still has block 3 and
		// a block 7 the first has not fetched.
		{"merged here, not there", []string{"20261201_1_5_1", "20261201_3_3_0", "20261201_7_7_0"}, []uint32{1, 1, 1}, 2},
		{"same range, two levels", []string{"20261201_1_5_1", "20261201_1_5_2"}, []uint32{1, 1}, 1},
		{"mutated part", []string{"20261201_1_5_1_8", "20261201_6_6_0"}, []uint32{1, 1}, 2},
		{"other partition", []string{"20261201_1_5_1", "20261202_3_3_0"}, []uint32{1, 1}, 2},
	} {
		got, err := copiesInParts(c.parts, c.rows)
		if err != nil || got != c.want {
			t.Errorf("%s: %d copies (%v), want %d", c.name, got, err, c.want)
		}
	}
	for _, bad := range []string{"all", "20261201_x_3_0", "20261201_5_3_0", "a_b_c_d_e_f"} {
		if _, err := copiesInParts([]string{bad}, []uint32{1}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("part %q: error %v, want one naming the part", bad, err)
		}
	}
}

// TestClusterCheckReadsEveryReplica stores copies of the same events on
// both replicas of each shard, with replication stopped, as two sinks
// routed to different replicas do before the replicas fetch each other's
// parts. A read through the Distributed stored_keys sees one copy; the
// check must see both, the scan must record them, and while a replica
// that holds copies is down the check must leave a scan pending that runs
// once it is back.
func TestClusterCheckReadsEveryReplica(t *testing.T) {
	c := chtest.StartCluster(t, 2, 2)
	ctx := t.Context()
	st, err := OpenStore(ctx, StoreOptions{DSN: c.DSN(), Database: "rep", ClickHouseCluster: chtest.ClusterName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, srv := range c.Servers() {
		if err := srv.ClusterConn(t, "rep").Exec(ctx, "SYSTEM STOP FETCHES"); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now() // as if the batch's lookup started now
	rows := racingRows(t, 0)
	set, err := recordSetOf(rows, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.InsertRecords(ctx, set); err != nil {
		t.Fatal(err)
	}
	// The insert went to the first replica of each shard; a second sink
	// routed to the second replicas stores the same events there.
	for _, shard := range c.Shards {
		q := fmt.Sprintf("INSERT INTO rep.events_local SELECT * FROM remote('127.0.0.1:%d', rep, events_local)", shard[0].Port)
		if err := shard[1].ClusterConn(t, "rep").Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if n := count(t, st, "SELECT count() FROM {db}.stored_keys"); n != uint64(len(rows)) {
		t.Fatalf("the Distributed stored_keys shows %d copies, want %d (one replica per shard): the test does not set up the race", n, len(rows))
	}
	refs, _ := dedup(set.rows, nil)
	check := func() map[eventKey]uint32 {
		t.Helper()
		doubled := map[eventKey]uint32{}
		if err := st.lookupKeys(ctx, refs, keyQuery{doubled: true}, func(k eventKey, copies uint32) { doubled[k] = copies }); err != nil {
			t.Fatal(err)
		}
		return doubled
	}
	doubled := check()
	if len(doubled) != len(refs) {
		t.Fatalf("the check found %d of %d events stored twice", len(doubled), len(refs))
	}
	for k, n := range doubled {
		if n != 2 {
			t.Fatalf("%v: %d copies, want 2", k, n)
		}
	}
	if st.ScanIsPending() {
		t.Fatal("a scan is pending although every replica answered")
	}
	// The check after an insert names each node's parts written since the
	// lookup: it must find the same copies, without falling back.
	nodes, err := st.ddl.nodes(ctx, st.conn)
	if err != nil {
		t.Fatal(err)
	}
	keys, days, err := batchKeys(refs)
	if err != nil {
		t.Fatal(err)
	}
	recent := map[eventKey]uint32{}
	ok, partial := st.checkRecentEveryReplica(ctx, nodes, keys,
		" WHERE event_date IN ? AND cluster = ? AND audit_id IN (SELECT audit_id FROM batch_keys)",
		[]any{clickhouse.GroupSet{Value: days}, refs[0].key.cluster}, since, func(k eventKey, n uint32) { recent[k] = n })
	if !ok || partial {
		t.Fatalf("the recent-parts check fell back (ok %v, partial %v)", ok, partial)
	}
	if fmt.Sprint(recent) != fmt.Sprint(doubled) {
		t.Fatalf("the recent-parts check found %v, the whole check %v", recent, doubled)
	}
	day := time.UnixMicro(refs[0].micros).UTC()
	if err := st.ScanDuplicates(ctx, day); err != nil {
		t.Fatal(err)
	}
	if n := count(t, st, "SELECT count() FROM {db}.duplicate_events FINAL WHERE copies = 2"); n != uint64(len(refs)) {
		t.Fatalf("the scan recorded %d events with 2 copies, want %d", n, len(refs))
	}

	t.Log("stop the second replica of shard 1, which holds the second copies of its events")
	down := c.Shards[0][1]
	down.Stop()
	seen := check()
	if !st.ScanIsPending() {
		t.Fatal("a check without a replica left no scan pending")
	}
	if len(seen) == 0 || len(seen) == len(refs) {
		t.Fatalf("with a replica down the check saw %d of %d events doubled, want those of the other shard only", len(seen), len(refs))
	}
	if ran, err := st.ScanPending(ctx); err == nil || ran {
		t.Fatalf("the pending scan ran (%v, %v) while a replica is down", ran, err)
	}
	down.Start()
	if ran, err := st.ScanPending(ctx); err != nil || !ran {
		t.Fatalf("the pending scan after the replica came back: ran %v, %v", ran, err)
	}
	if st.ScanIsPending() {
		t.Fatal("a scan is still pending after it ran")
	}
}
