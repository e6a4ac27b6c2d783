package store

import (
	"crypto/sha256"
	"encoding/hex"
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

// releasedMigrations are the SHA-256 of each released migration's SQL
// (Migration.SQL("db"), its statements joined by "\n;\n"), by version.
// Part of that SQL is written out from definitions shared with the code
// (the events columns, from record's column table), so reading a diff of
// schema.go does not show every change to it; this does. Pin a migration
// here when it is released.
var releasedMigrations = map[int]string{
	1:  "4fb500a38d7ce47e43038615529f811e0ee1c0d4a6c59fd1c43ae46a076b9c7d",
	2:  "8636519e47fc684d61bff3eb3ad184ebb419edae176ea0aff8e3c25f5334f5bf",
	3:  "7427de81b4db8cdc80e7735b1bccf6af5e4cbfa50a04001090c4aaaaec80f726",
	4:  "fe9ed1aa83100536441de2b0c81b61799b77918f52968b8d76fde3daf3833450",
	5:  "6589a7eb3e5c0226298b1cb20d3c08cae07f11a25a9a431ed5a5d234d47f26b2",
	6:  "1bca6042d5e3870e32c3748fdd4267719d7475350a68880da7504033c8232a53",
	7:  "f3638e5e39c3bb69d31f33e4e9078e5e0dda0dff2301df375547f7786cdfe46e",
	8:  "98bc2baf50a8f597bf752ac5b356245705778b8af6f3f0206e62d254e490e744",
	9:  "bf9bea55b0b99c8e21f85527400d838f0852e8d02347631727fd6e717cafd10d",
	10: "2988e54fd576aaee4484bca03ce32916f0870f5f13ccd088b4e61bda070d6e20",
	11: "b6a940f1b80c15ecb500f8101a3731a3bc0dec22d0a0b69bb3e08c8ef0ef72a7",
	12: "43978d9f2fe78f40de0fb1c7aa9bb3f6241e7279cc4b3c57ccf78e0b6b757d3d",
	13: "b19b18cdb19cdca75262e5f3714c822680fdb8d22f11d686a0533012b582c8f6",
	14: "963807c43f56a9da12346dd4021383cb1e28f7f1e7a071056a9ccf56675cbffd",
	15: "1dd5c48bdab06d793fdf03b78aacd7e2241bc8c741c26e1d16bfcc3cc8a3e8d7",
}

// TestReleasedMigrationsAreFixed fails when the SQL of a released
// migration changes: a database migrated before the change and one
// migrated after would differ. A column for the events tables, say, needs
// a migration of its own, not a change to the CREATE TABLE of 1 and 6.
func TestReleasedMigrationsAreFixed(t *testing.T) {
	seen := map[int]bool{}
	for _, m := range Migrations {
		want, ok := releasedMigrations[m.Version]
		if !ok {
			continue
		}
		seen[m.Version] = true
		sum := sha256.Sum256([]byte(strings.Join(m.SQL("db"), "\n;\n")))
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("migration %d (%s) changed: its SQL hashes to %s, released as %s", m.Version, m.Name, got, want)
		}
	}
	for v := range releasedMigrations {
		if !seen[v] {
			t.Errorf("released migration %d is gone", v)
		}
	}
}
