package chtest_test

import (
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/test/chtest"

	"github.com/stampguard/stampguard/test/testenv"
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

func TestStartServerOutsideATest(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	dir := t.TempDir()
	srv, err := chtest.StartServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if srv.Dir != dir {
		t.Fatalf("Dir = %s, want %s", srv.Dir, dir)
	}
	var one uint8
	if err := srv.Conn(t, "default").QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	srv.Stop()
	if srv.PID() != 0 {
		t.Fatal("PID after Stop is not 0")
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port)))
	if err != nil {
		t.Fatalf("the native port is still taken after Stop: %v", err)
	}
	l.Close()
}

// Under -short off CI, a test that starts a server is skipped before the
// server starts. The check runs in a child test process with -short and
// without CI, so that it runs (and can fail) in every run, CI included.
func TestStartSkipsUnderShort(t *testing.T) {
	if os.Getenv("CHTEST_SHORT_CHILD") == "1" {
		var started bool
		t.Run("a test that starts a server", func(t *testing.T) {
			chtest.Start(t)
			started = true
		})
		if started {
			t.Fatal("chtest.Start returned under -short: the server started")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStartSkipsUnderShort$", "-test.short", "-test.v")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CI=") }), "CHTEST_SHORT_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the -short child failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- SKIP: TestStartSkipsUnderShort/a_test_that_starts_a_server") {
		t.Fatalf("under -short the server test was not skipped:\n%s", out)
	}
}

// TestStartInTimeZone runs a server at UTC-5: its own zone is the one
// given, and toDate without a zone computes there (02:00 UTC on 2 December
// is still 1 December in New York), while toDate(x, 'UTC') does not.
func TestStartInTimeZone(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := chtest.StartInTimeZone(t, "America/New_York")
	got, err := srv.QueryText(t, "", "SELECT timezone(), toDate(toDateTime(1796176800)), toDate(toDateTime(1796176800), 'UTC')", "")
	if err != nil {
		t.Fatal(err)
	}
	if want := "America/New_York\t2026-12-01\t2026-12-02\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
