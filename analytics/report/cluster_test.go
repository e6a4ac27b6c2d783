package report

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
)

// TestClusterReportEqualsSingleNode stores the same rows, every batch
// delivered twice, into one node and into a 2-shard x 2-replica cluster in
// sharded mode, and requires the same report from both over windows that
// cut hours, rollup-backed and raw; and the same field history findings,
// read raw and from the hour caches.
func TestClusterReportEqualsSingleNode(t *testing.T) {
	ctx := t.Context()
	single, db := migrated(t)
	c := chtest.StartCluster(t, 2, 2)
	clustered, err := store.Open(ctx, store.Options{DSN: c.DSN(), Database: db, ClickHouseCluster: chtest.ClusterName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clustered.Close() })
	for range 2 { // the second run finds the schema in place
		if _, err := clustered.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rows := append(buildScenario().rows, randomRows(11, 4000)...)
	rand.New(rand.NewPCG(12, 13)).Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	for i := 0; i < len(rows); i += 500 {
		batch := rows[i:min(i+500, len(rows))]
		for _, st := range []*store.Store{single, clustered} {
			stored := 0
			for range 2 {
				res, err := st.InsertRecords(ctx, recordtest.Set(batch, nil))
				if err != nil {
					t.Fatal(err)
				}
				stored += res.Stored
			}
			if stored == 0 {
				t.Fatalf("batch %d stored nothing", i)
			}
		}
	}
	var perShard []uint64
	for _, shard := range c.Shards {
		var n uint64
		if err := shard[0].ClusterConn(t, db).QueryRow(ctx, "SELECT count() FROM events_by_hour_local").Scan(&n); err != nil {
			t.Fatal(err)
		}
		perShard = append(perShard, n)
	}
	if perShard[0] == 0 || perShard[1] == 0 {
		t.Errorf("events per shard %v: sharding by object put everything on one shard", perShard)
	}
	windows := [][2]time.Time{
		{t0, t0.Add(time.Hour)},
		{t0.Add(-time.Hour), t0.Add(5 * time.Hour)},
		{t0.Add(35 * time.Second), t0.Add(3*time.Hour + 1)},
		{t0.Add(-30 * time.Minute), t0.Add(2*time.Hour + time.Microsecond)},
	}
	for _, w := range windows {
		for _, noRollup := range []bool{false, true} {
			o := Options{Database: db, Cluster: "c1", Top: 1000, Since: w[0], Until: w[1], NoRollup: noRollup}
			want, err := Build(ctx, single.Conn(), o)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Build(ctx, clustered.Conn(), o)
			if err != nil {
				t.Fatalf("cluster report over [%s, %s): %v", w[0], w[1], err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("window [%s, %s) noRollup=%v: cluster and single node differ\ncluster %+v\n single %+v", w[0], w[1], noRollup, got, want)
			}
		}
	}
	// The field history findings, read raw and from the hour caches: the
	// same synthesized writes, in hours of their own, on both. The
	// caches are built through the Distributed tables, and an object's
	// rows live on one shard.
	hist := t0.Add(10 * time.Hour)
	for _, st := range []*store.Store{single, clustered} {
		if err := Synthesize(ctx, st.Conn(), db, "bench", 10_000, 7, hist, 4*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	historyWindows := [][2]time.Time{
		{hist, hist.Add(4 * time.Hour)},
		{hist.Add(17*time.Minute + 3*time.Second), hist.Add(3*time.Hour + 41*time.Minute)},
	}
	checkHistory := func(stage string, windows [][2]time.Time) {
		t.Helper()
		for _, w := range windows {
			o := Options{Database: db, Cluster: "bench", Top: 100_000, Since: w[0], Until: w[1], History: true}
			want, err := Build(ctx, single.Conn(), o)
			if err != nil {
				t.Fatal(err)
			}
			if len(want.LostUpdates) == 0 || len(want.FieldFights) == 0 || len(want.ConflictCauses) == 0 || len(want.NoopWrites) == 0 {
				t.Fatalf("%s, window [%s, %s): %d lost updates, %d fights, %d conflict causes, %d no-op writers: nothing to compare",
					stage, w[0], w[1], len(want.LostUpdates), len(want.FieldFights), len(want.ConflictCauses), len(want.NoopWrites))
			}
			got, err := Build(ctx, clustered.Conn(), o)
			if err != nil {
				t.Fatalf("%s: cluster report over [%s, %s): %v", stage, w[0], w[1], err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s, window [%s, %s): the cluster's history findings differ from the single node's\ncluster %+v\n single %+v", stage, w[0], w[1], got, want)
			}
		}
	}
	checkHistory("raw", historyWindows[1:]) // raw over any window is one segment
	for _, st := range []*store.Store{single, clustered} {
		for h := hist; h.Before(hist.Add(4 * time.Hour)); h = h.Add(time.Hour) {
			if err := st.CompactHour(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The cluster reads the four hours from their caches, not raw.
	o := Options{Database: db, Cluster: "bench", Since: hist, Until: hist.Add(4 * time.Hour)}
	if err := o.split(ctx, clustered.Conn()); err != nil {
		t.Fatal(err)
	}
	var bounds uint64
	if err := clustered.Conn().QueryRow(ctx, "SELECT count() FROM "+db+".hour_field_bounds WHERE cluster = 'bench'").Scan(&bounds); err != nil {
		t.Fatal(err)
	}
	if len(o.plan.Clean) != 4 || bounds == 0 {
		t.Fatalf("the cluster's plan has %d clean hours of 4, and %d field bounds cached", len(o.plan.Clean), bounds)
	}
	checkHistory("compacted", historyWindows)
	// Blocks of the compacted hours (two of two hours, from 18:00 and
	// 20:00), built through the Distributed tables, read in place of
	// their hours.
	for _, st := range []*store.Store{single, clustered} {
		if bs, err := st.CompactBlocks(ctx, hist); err != nil || len(bs) != 2 {
			t.Fatalf("blocks built %v (%v), want two of two hours", bs, err)
		}
	}
	o.History = true
	if err := o.split(ctx, clustered.Conn()); err != nil {
		t.Fatal(err)
	}
	if len(o.plan.Blocks) != 2 {
		t.Fatalf("the cluster's plan reads blocks %v, want the two built", o.plan.Blocks)
	}
	checkHistory("blocks", historyWindows)

	// Retention drops the days on every node.
	if _, err := clustered.DropPartitionsBefore(ctx, t0.Add(30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, srv := range c.Servers() {
		var n uint64
		if err := srv.ClusterConn(t, db).QueryRow(ctx, "SELECT count() FROM events_by_hour_local").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("server %d keeps %d events after retention dropped every day", srv.Port, n)
		}
	}
}
