package analytics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/internal/chtest"
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
				if strings.Contains(o, "MATERIALIZED VIEW") && strings.Contains(o, "FROM {db}.events\n") {
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
// 2-replica cluster as cluster mode renders it.
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

// TestClusterRacingWritersRecordEveryCopy is TestRacingWritersRecordEveryCopy
// on a 2x2 cluster: two stores insert the same rows at once, skipping the
// lookup, and the last check must see both copies of every row.
func TestClusterRacingWritersRecordEveryCopy(t *testing.T) {
	c := chtest.StartCluster(t, 2, 2)
	var stores []*Store
	for range 2 {
		st, err := OpenStore(t.Context(), StoreOptions{DSN: c.DSN(), Database: "race", ClickHouseCluster: chtest.ClusterName})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		stores = append(stores, st)
	}
	if _, err := stores[0].Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		rows := racingRows(t, round)
		// Different blocks, as two sinks that batched differently send:
		// ClickHouse's replicated block deduplication drops an identical
		// block, but not these.
		extra := racingRows(t, 1000+round)
		doubled := raceInserts(t, stores, func(i int) []audit.Row {
			if i == 1 {
				return append(append([]audit.Row(nil), rows...), extra...)
			}
			return rows
		})
		prefix := fmt.Sprintf("r%d-%%", round)
		if n := count(t, stores[0], "SELECT count() FROM {db}.stored_keys WHERE audit_id LIKE ?", prefix); n != uint64(2*len(rows)) {
			t.Fatalf("round %d: stored_keys holds %d copies, want %d", round, n, 2*len(rows))
		}
		if doubled != len(rows) {
			t.Errorf("round %d: the last check saw %d doubled rows, want %d", round, doubled, len(rows))
		}
	}
}
