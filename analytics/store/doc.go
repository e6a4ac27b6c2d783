// Package store is the ClickHouse side of the audit analytics: the
// connection (Open, ParseDSN, and the settings a server's version needs)
// and the insert of a record.Set (InsertRecords), both in store.go; the
// schema as fixed migrations (schema.go for the events and their caches,
// schema_history.go for the field history and its caches, over the
// definitions of package analytics/sql and the events columns of package
// analytics/record; Migrate, migrate.go, applies them, and cluster.go
// renders them for a ClickHouse cluster); the hour caches (Compact,
// compact.go), the blocks of hours (CompactBlocks, blocks.go) and
// retention (DropPartitionsBefore).
//
// Exactness is a property of the schema, not of the writers: every read
// takes each event once by its identity, however often it was inserted,
// so an insert needs no lookup before it and no check after it
// (docs/auditsink.md, "Exactly once"). The package knows nothing of the
// pipelines that feed it; its errors are the driver's, wrapped with what
// failed.
package store
