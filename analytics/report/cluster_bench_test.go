package report

import (
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"
)

// BenchmarkClusterReport builds the whole report over a day of synthetic
// events (REPORT_BENCH_EVENTS, 10 million by default) stored in a 2-shard x
// 2-replica cluster in sharded mode, on the same machine: the report reads
// the Distributed tables, each shard answering for its objects.
func BenchmarkClusterReport(b *testing.B) {
	c := chtest.StartCluster(b, 2, 2)
	ctx := b.Context()
	const db = "bench"
	store, err := store.Open(ctx, store.Options{DSN: c.DSN(), Database: db, ClickHouseCluster: chtest.ClusterName})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	n := benchEvents()
	start := time.Now()
	if err := Synthesize(ctx, store.Conn(), db, "bench", n, 42, t0, 24*time.Hour); err != nil {
		b.Fatal(err)
	}
	b.Logf("synthesized %d events into the cluster in %s", n, time.Since(start).Round(time.Millisecond))
	for _, srv := range c.Servers() {
		conn := srv.ClusterConn(b, db)
		for _, table := range []string{"events_by_hour_local", "hour_requests_local"} {
			if err := conn.Exec(ctx, "SYSTEM SYNC REPLICA "+table); err != nil {
				b.Fatal(err)
			}
			if err := conn.Exec(ctx, "OPTIMIZE TABLE "+table+" FINAL"); err != nil {
				b.Logf("optimize %s: %v", table, err)
			}
		}
	}
	o := Options{Database: db, Cluster: "bench", Since: t0, Until: t0.Add(24 * time.Hour), Top: 10}
	r, err := Build(ctx, store.Conn(), o)
	if err != nil {
		b.Fatal(err)
	}
	if r.Totals.Requests < n*99/100 {
		b.Fatalf("the cluster report counts %d requests of %d events", r.Totals.Requests, n)
	}
	cut := o
	cut.Since, cut.Until = t0.Add(17*time.Minute+13*time.Second+5*time.Microsecond), t0.Add(23*time.Hour+41*time.Minute)
	for name, o := range map[string]Options{"whole": o, "whole-cut-hours": cut} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Build(ctx, store.Conn(), o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
