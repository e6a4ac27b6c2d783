package store

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

func TestClusterDDLRendersEveryMigration(t *testing.T) {
	c := &clusterDDL{cluster: "prod"}
	for _, m := range Migrations {
		for _, q := range m.Statements {
			out, err := c.render(q)
			if err != nil {
				t.Errorf("migration %d: %v", m.Version, err)
				continue
			}
			for _, o := range out {
				if strings.HasPrefix(o, "CREATE") && !strings.Contains(o, " ON CLUSTER prod") {
					t.Errorf("migration %d: DDL without ON CLUSTER: %s", m.Version, o)
				}
				if strings.Contains(o, "MATERIALIZED VIEW") && (strings.Contains(o, "FROM {db}.events\n") || strings.Contains(o, "FROM {db}.events_by_hour\n")) {
					t.Errorf("migration %d: a view reads the Distributed events table: %s", m.Version, o)
				}
			}
		}
	}
	if _, err := c.render("CREATE TABLE {db}.x (a UInt8) ENGINE = Memory"); err == nil {
		t.Error("an unknown statement shape was rendered")
	}
}

// TestClusterSchemaOnARealCluster applies every migration to a 2-shard,
// 2-replica cluster as sharded mode renders it.
func TestClusterSchemaOnARealCluster(t *testing.T) {
	c := chtest.StartCluster(t, 2, 2)
	conn := c.Shards[0][0].ClusterConn(t, "default")
	ddl := clusterDDL{cluster: chtest.ClusterName}
	run := func(q string) {
		t.Helper()
		out, err := ddl.render(q)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			if err := conn.Exec(t.Context(), strings.ReplaceAll(o, "{db}", "sg")); err != nil {
				t.Fatalf("%s: %v", o, err)
			}
		}
	}
	run("CREATE DATABASE IF NOT EXISTS sg")
	for _, m := range Migrations {
		for _, q := range m.Statements {
			run(q)
		}
	}
	for _, srv := range c.Servers() {
		var n uint64
		if err := srv.ClusterConn(t, "sg").QueryRow(t.Context(),
			"SELECT count() FROM system.tables WHERE database = 'sg' AND name = 'events_local'").Scan(&n); err != nil || n != 1 {
			t.Errorf("server %d: events_local count %d (%v)", srv.Port, n, err)
		}
	}
}

// TestClusterEveryCopyCountsOnce is TestEveryCopyCountsOnce on a 2x2
// cluster: two stores insert the same events at once in different blocks
// (as two sinks that batched differently send them), the hours are
// compacted through the Distributed tables, a redelivery lands, and the
// whole report, read both ways, equals one clean insert's on one node.
func TestClusterEveryCopyCountsOnce(t *testing.T) {
	rows, extra := exactRows(t, "cluster"), exactRows(t, "cluster-extra")[:3]
	want := truth(t, append(append([]audit.Row(nil), rows...), extra...))
	since, until := window(rows)
	c := chtest.StartCluster(t, 2, 2)
	var stores []*Store
	for range 2 {
		st, err := Open(t.Context(), Options{DSN: c.DSN(), Database: "exact", ClickHouseCluster: chtest.ClusterName})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		stores = append(stores, st)
	}
	if _, err := stores[0].Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, st := range stores {
		batch := rows
		if i == 1 {
			batch = append(append([]audit.Row(nil), rows[3:]...), extra...)
		}
		wg.Go(func() { _, errs[i] = st.InsertRecords(t.Context(), recordtest.Set(batch, nil)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	st := stores[0]
	requireTruth(t, st, want, since, until, "after racing inserts")
	if _, err := st.Compact(t.Context(), since, 0); err != nil {
		t.Fatal(err)
	}
	if n := cleanHours(t, st, since, until); n == 0 {
		t.Fatal("no hour is clean after a compaction")
	}
	requireTruth(t, st, want, since, until, "after compaction")
	if _, err := stores[1].InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	requireTruth(t, st, want, since, until, "after a redelivery")
}
