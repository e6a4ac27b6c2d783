package chtest_test

import (
	"os"
	"testing"

	"github.com/stampguard/stampguard/internal/chtest"

	"github.com/stampguard/stampguard/internal/testenv"
)

func TestServerAnswersAndSurvivesRestart(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := chtest.Start(t)
	db := srv.NewDatabase(t)
	conn := srv.Conn(t, db)
	if err := conn.Exec(t.Context(), "CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x"); err != nil {
		t.Fatal(err)
	}
	b, err := conn.PrepareBatch(t.Context(), "INSERT INTO t (x)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := b.Append(uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := conn.Ping(t.Context()); err == nil {
		t.Fatal("ping succeeded while the server was stopped")
	}
	srv.Start()
	var n uint64
	if err := srv.Conn(t, db).QueryRow(t.Context(), "SELECT count() FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 10 {
		t.Fatalf("count after restart = %d, want 10", n)
	}
}

// Under -short off CI, a test that starts a server is skipped before the
// server starts.
func TestStartSkipsUnderShort(t *testing.T) {
	if !testing.Short() || os.Getenv("CI") == "true" {
		t.Skip("checks the -short skip; run with go test -short")
	}
	var started bool
	t.Run("a test that starts a server", func(t *testing.T) {
		chtest.Start(t)
		started = true
	})
	if started {
		t.Fatal("chtest.Start returned under -short: the server started")
	}
}
