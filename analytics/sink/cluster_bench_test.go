package sink

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/test/chtest"
)

// BenchmarkClusterEndToEnd sends the batches of BenchmarkEndToEnd (400
// events, 4 senders) to one `auditsink serve` process storing into one
// ClickHouse node, and in the same run to one storing into a 2-shard x
// 2-replica cluster in sharded mode (the four servers and ZooKeeper on
// this same machine), each timed until the last event is stored.
func BenchmarkClusterEndToEnd(b *testing.B) {
	const perBody, senders = 400, 4
	batches := benchEvents() / perBody
	templates := benchTemplates(b)
	bin := buildSink(b)
	single := chtest.Start(b)
	c := chtest.StartCluster(b, 2, 2)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: senders}}
	var secs [2]float64
	run := 0
	for b.Loop() {
		run++
		for i, mode := range []string{"single", "cluster"} {
			b.StopTimer()
			dsn, clusterFlag, conn := single.DSN(), "", driver.Conn(nil)
			db := "bench" + mode
			if mode == "cluster" {
				dsn, clusterFlag = c.DSN(), chtest.ClusterName
				conn = c.Shards[0][0].ClusterConn(b, "default")
			} else {
				conn = single.Conn(b, "default")
			}
			url, stop := startClusterSink(b, bin, dsn, clusterFlag, db)
			bodies := make([][]byte, batches)
			for k := range bodies {
				bodies[k] = benchBody(templates, run*10+i, k, perBody)
			}
			b.StartTimer()
			start := time.Now()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range senders {
				wg.Go(func() {
					for k := int(next.Add(1)) - 1; k < batches; k = int(next.Add(1)) - 1 {
						if code, err := post400(client, url, bodies[k]); err != nil || code != 200 {
							b.Errorf("batch %d: %d %v", k, code, err)
							return
						}
					}
				})
			}
			wg.Wait()
			waitStoredIn(b, conn, db, uint64(run*batches*perBody))
			secs[i] += time.Since(start).Seconds()
			b.StopTimer()
			stop()
			b.StartTimer()
		}
	}
	events := float64(run * batches * perBody)
	b.ReportMetric(events/secs[0], "single-events/s")
	b.ReportMetric(events/secs[1], "cluster-events/s")
	b.ReportMetric(secs[0]/secs[1], "cluster/single")
}

func startClusterSink(b *testing.B, bin, dsn, cluster, db string) (string, func()) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("bench-0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		b.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	env := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+dsn, "AUDITSINK_CLICKHOUSE_CLUSTER="+cluster)
	// Migrate first: ON CLUSTER DDL takes seconds, and is not the point.
	mig := exec.Command(bin, "migrate", "--database", db)
	mig.Env = env
	if out, err := mig.CombinedOutput(); err != nil {
		b.Fatalf("migrate: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "serve", "--plaintext", "--listen", addr, "--token-file", filepath.Join(dir, "token"),
		"--spool-dir", filepath.Join(dir, "spool"), "--spool-max", "4GiB", "--metrics-listen", "",
		"--database", db, "--log-level", "warn")
	cmd.Env = env
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("sink did not listen")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "http://" + addr, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
}

// waitStoredIn waits until db.events_by_hour (a Distributed table in sharded mode)
// holds want rows.
func waitStoredIn(b *testing.B, conn driver.Conn, db string, want uint64) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n uint64
		err := conn.QueryRow(context.Background(), "SELECT count() FROM "+db+".events_by_hour").Scan(&n)
		if err == nil && n == want {
			return
		}
		if n > want || time.Now().After(deadline) {
			b.Fatalf("%s.events_by_hour = %d, want %d (%v)", db, n, want, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
