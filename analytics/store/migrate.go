package store

import (
	"context"
	"fmt"
	"strings"
)

// Migrate creates the database and applies the migrations not yet recorded
// in schema_migrations. It returns the versions it applied.
//
// Everything it runs is SQL text (MigrateSetupSQL, SchemaVersionSQL,
// Migration.SQL), so that a test can apply the same sequence to an engine
// it has no driver for.
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	if err := s.checkProfile(ctx); err != nil {
		return nil, err
	}
	// Statements keep {db} for execDDL, which renders them for a cluster.
	for _, q := range MigrateSetupSQL("{db}") {
		if err := s.execDDL(ctx, q); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	current, err := s.SchemaVersion(ctx)
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range Migrations {
		if m.Version <= current {
			continue
		}
		for _, q := range m.SQL("{db}") {
			if err := s.execDDL(ctx, q); err != nil {
				return applied, fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
			}
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// MigrateSetupSQL are the statements Migrate runs first, on every start:
// the database and the schema_migrations table.
func MigrateSetupSQL(db string) []string {
	return []string{
		"CREATE DATABASE IF NOT EXISTS " + db,
		`CREATE TABLE IF NOT EXISTS ` + db + `.schema_migrations (
			version    UInt32,
			name       String,
			applied_at DateTime
		) ENGINE = MergeTree() ORDER BY version`,
	}
}

// SchemaVersionSQL selects the highest applied migration (0 for none), one
// UInt32.
func SchemaVersionSQL(db string) string {
	return "SELECT max(version) FROM " + db + ".schema_migrations"
}

// SQL is the migration for database db: its statements with {db} filled
// in, then the INSERT that records it in schema_migrations.
func (m Migration) SQL(db string) []string {
	out := make([]string, 0, len(m.Statements)+1)
	for _, q := range m.Statements {
		out = append(out, strings.ReplaceAll(q, "{db}", db))
	}
	return append(out, fmt.Sprintf("INSERT INTO %s.schema_migrations (version, name, applied_at) SELECT toUInt32(%d), %s, now()",
		db, m.Version, quoteString(m.Name)))
}

// quoteString is s as a ClickHouse string literal.
func quoteString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// SchemaCurrent reports, without DDL, whether the schema is at this
// binary's latest migration or newer, so that a writer without DDL rights
// (serve --no-migrate) can skip Migrate. A database or schema_migrations
// table that does not exist is an error.
func (s *Store) SchemaCurrent(ctx context.Context) (bool, error) {
	if err := s.checkProfile(ctx); err != nil {
		return false, err
	}
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return false, err
	}
	return v >= Migrations[len(Migrations)-1].Version, nil
}

// SchemaVersion is the highest applied migration (0 for none).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v uint32
	if err := s.conn.QueryRow(ctx, SchemaVersionSQL(s.db)).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return int(v), nil
}
