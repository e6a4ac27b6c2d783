package chtest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/test/chtest"
)

// TestClusterReplicatesAndShards checks the harness the way sharded mode
// uses it: ON CLUSTER DDL reaches all four servers, a Distributed insert
// with insert_distributed_sync spreads rows over both shards, each shard's
// second replica fetches its part, and a FINAL read through the Distributed
// table collapses repeated keys, which land on one shard.
func TestClusterReplicatesAndShards(t *testing.T) {
	c := chtest.StartCluster(t, 2, 2)
	ctx := t.Context()
	conn := c.Shards[0][0].ClusterConn(t, "default")
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS k ON CLUSTER " + chtest.ClusterName,
		"CREATE TABLE IF NOT EXISTS k.t_local ON CLUSTER " + chtest.ClusterName +
			" (key String, v UInt64, s LowCardinality(String)) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/k/t', '{replica}') ORDER BY key",
		"CREATE TABLE IF NOT EXISTS k.t ON CLUSTER " + chtest.ClusterName +
			" AS k.t_local ENGINE = Distributed(" + chtest.ClusterName + ", k, t_local, cityHash64(key))",
	} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	b, err := conn.PrepareBatch(clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1})),
		"INSERT INTO k.t (key, v, s)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		if err := b.Append(fmt.Sprintf("key-%d", i%1000), uint64(i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	// A Distributed read picks a replica of each shard, and a second
	// replica serves the rows once it fetched the part: wait for both
	// replicas of every shard to hold the same rows.
	for _, shard := range c.Shards {
		for _, srv := range shard[1:] {
			if err := srv.ClusterConn(t, "k").Exec(ctx, "SYSTEM SYNC REPLICA t_local"); err != nil {
				t.Fatalf("sync replica: %v", err)
			}
		}
	}
	var n uint64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if err := conn.QueryRow(ctx, "SELECT count() FROM k.t FINAL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1000 || time.Now().After(deadline) {
			break
		}
	}
	if n != 1000 {
		t.Errorf("distinct keys through the Distributed table = %d, want 1000", n)
	}
	for s, shard := range c.Shards {
		var counts []uint64
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			counts = counts[:0]
			for _, srv := range shard {
				var got uint64
				if err := srv.ClusterConn(t, "k").QueryRow(ctx, "SELECT count() FROM t_local FINAL").Scan(&got); err != nil {
					t.Fatal(err)
				}
				counts = append(counts, got)
			}
			if counts[0] == counts[1] || time.Now().After(deadline) {
				break
			}
		}
		if counts[0] == 0 || counts[0] == 1000 {
			t.Errorf("shard %d holds %d of 1000 keys: the rows were not spread over the shards", s+1, counts[0])
		}
		if counts[1] != counts[0] {
			t.Errorf("shard %d: replicas hold %v keys: replication did not catch up", s+1, counts)
		}
	}
}
