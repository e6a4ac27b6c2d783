package chdbtest

import (
	"strings"
	"testing"

	"github.com/stampguard/stampguard/test/testenv"
)

func TestMain(m *testing.M) { Main(m) }

func TestEngine(t *testing.T) {
	testenv.SkipIfShort(t, "loads ClickHouse 26.7 (chDB)")
	e := Open(t)
	if v, err := e.Query("SELECT version()", ""); err != nil || !strings.HasPrefix(v, "26.7.") {
		t.Fatalf("version() = %q, %v; want 26.7.x", v, err)
	}
	db := e.NewDatabase(t)
	e.Exec(t,
		"CREATE TABLE "+db+".t (a UInt32, s String) ENGINE = MergeTree ORDER BY a",
		"INSERT INTO "+db+".t (a, s) FORMAT TabSeparated\n1\tx\\ty\n2\t'q'\n",
	)
	if got, err := e.Query("SELECT a, s FROM "+db+".t ORDER BY a", "TabSeparated"); err != nil || got != "1\tx\\ty\n2\t\\'q\\'\n" {
		t.Fatalf("inline insert read back as %q, %v", got, err)
	}
	if _, err := e.Query("SELECT nosuchfunction(1)", ""); err == nil || !strings.Contains(err.Error(), "Code: 46") {
		t.Fatalf("an unknown function gave %v, want ClickHouse's Code 46", err)
	}
}

func TestMissingLibraryNamesTheMakeTarget(t *testing.T) {
	_, err := boot(t.TempDir() + "/libchdb.so")
	if err == nil || !strings.Contains(err.Error(), "make chdb") {
		t.Fatalf("load of a missing library: %v, want an error naming make chdb", err)
	}
}
