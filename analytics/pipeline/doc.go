// Package pipeline brings audit events from their sources into the store:
// the sink's spool (serve), audit log files (ingest) and a live log (tail).
//
// Every source takes one path, in pipeline.go. The Accepter decodes raw
// events (package audit) and encodes the kept ones as records (package
// record); serve appends them to its spool (package spool), ingest and
// tail to an in-memory Queue (queue.go), because their log file is their
// durable buffer. The Drainer reads records from either source, parses
// them into a record.Set and stores it with the store's InsertRecords,
// retrying while ClickHouse is away (retry), and confirms what was
// stored, in order. IngestFiles (ingest.go, with its progress line) and
// Tail (tail.go) drive it for files; DrainSpool (periodic.go) for serve,
// with the jobs that run every interval (compaction of the hour caches,
// retention) written once. Metrics (metrics.go) and the live conflict
// Signals (signals.go) are the sink's Prometheus side.
package pipeline
