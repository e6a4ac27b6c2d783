package store

import (
	"strings"
	"testing"
)

func TestMigrationSQL(t *testing.T) {
	m := Migration{Version: 7, Name: `it's a \ test`, Statements: []string{"CREATE TABLE {db}.a (x UInt8) ENGINE = Memory", "SELECT 1 FROM {db}.a"}}
	got := m.SQL("prod")
	want := []string{
		"CREATE TABLE prod.a (x UInt8) ENGINE = Memory",
		"SELECT 1 FROM prod.a",
		`INSERT INTO prod.schema_migrations (version, name, applied_at) SELECT toUInt32(7), 'it\'s a \\ test', now()`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, m := range Migrations {
		for _, q := range m.SQL("db") {
			if strings.Contains(q, "{db}") {
				t.Errorf("migration %d leaves {db} in %.80s", m.Version, q)
			}
		}
	}
}
