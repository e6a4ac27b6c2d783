package analytics

import (
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/chtest"
)

func TestClusterDDLRendersEveryMigration(t *testing.T) {
	c := clusterDDL{cluster: "prod"}
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
