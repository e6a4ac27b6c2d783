// Package analytics is the audit half of stampguard: it stores
// kube-apiserver audit events in ClickHouse so that every figure read from
// them counts each event once, and reports on them. It holds no code; its
// packages, in the order an event passes them:
//
//   - sink: the HTTP endpoint of the apiserver's audit webhook (and the
//     options of every auditsink subcommand);
//   - audit: decoding an audit event into a Row, and what a row means
//     (requests, writes, conflict classes);
//   - pipeline: Accepter, spool or Queue, Drainer, retry, ingest and tail,
//     the periodic jobs and the sink's metrics;
//   - record: the record format between decoding and insert, and the
//     insert's native columns built from it;
//   - spool: serve's durable buffer of records;
//   - logfile: reading and following audit log files;
//   - store: ClickHouse: connection, migrations, insert, hour caches,
//     retention;
//   - sql: every SQL text the store, the report and the dashboards run;
//   - report: the report over the stored events.
//
// One event from the HTTP handler to a ClickHouse row: sink/server.go,
// pipeline/accept.go (audit/decode.go decodes it, record/record.go encodes
// it), spool/spool.go, pipeline/drainer.go (record.Set.Add parses it),
// store/store.go, record/columns.go (its columns).
package analytics
