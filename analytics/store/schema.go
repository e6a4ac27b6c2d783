package store

import "slices"

// Migration is one versioned schema step. Every statement is idempotent
// (IF NOT EXISTS), so a migration interrupted half-way, or run by two sinks
// starting at once, converges. Statements use only SQL that ClickHouse 18.16
// and current releases both accept: no TTL, codecs, DateTime64, JSON types
// or toStartOfInterval.
type Migration struct {
	Version int
	Name    string
	// Statements are templates; {db} is replaced with the database name.
	Statements []string
}

// Migrations are applied in order by Store.Migrate. Append new versions;
// never edit a released one. Their SQL is fixed text, never built from
// constants that a later change could edit: a database migrated later must
// compute what one migrated earlier computes. The one exception is the
// events tables' column list, written out from record's column table so
// that the tables and the insert agree (eventsColumnsDDL); the text of
// every released migration is pinned by TestReleasedMigrationsAreFixed.
var Migrations = slices.Concat(eventMigrations, historyMigrations)

// eventMigrations are 1 to 9: the events, their counters and the hour
// caches of the counters and the retry loops.
var eventMigrations = []Migration{
	{
		Version: 1,
		Name:    "events, event_keys and dead_letters",
		Statements: []string{
			// One row per stored audit event (stage), flattened. Ordered by
			// object then time for the per-object analytics (conflict
			// sequences, retry loops, lease holders); partitioned by day so
			// retention drops whole partitions. The ReplacingMergeTree key
			// contains the dedup identity (cluster, audit_id, stage,
			// fingerprint) and only fields determined by it, so it is the
			// backstop that collapses any duplicate that got past the
			// writer's event_keys check.
			// Array columns are Array(String): clickhouse-go v2.51 cannot
			// read an 18.16 block of Array(LowCardinality(String)) whose
			// arrays are all empty ("unexpected packet 0").
			`CREATE TABLE IF NOT EXISTS {db}.events ` + eventsColumnsDDL + ` ENGINE = ReplacingMergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, api_group, resource, namespace, name, event_time_us, audit_id, stage, fingerprint)`,
			// The durable record of what was stored: the writer looks a
			// batch's keys up here and drops those already present before it
			// inserts, so redelivered events never reach the insert stream
			// (and so never reach rollups fed by materialized views).
			`CREATE TABLE IF NOT EXISTS {db}.event_keys (
				event_date  Date,
				cluster     LowCardinality(String),
				audit_id    String,
				stage       LowCardinality(String),
				fingerprint UInt64
			) ENGINE = ReplacingMergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, audit_id, stage, fingerprint)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.event_keys_mv TO {db}.event_keys
			AS SELECT event_date, cluster, audit_id, stage, fingerprint FROM {db}.events`,
			// Inputs that could not become rows, with the reason and the
			// (redacted or withheld) raw bytes.
			`CREATE TABLE IF NOT EXISTS {db}.dead_letters (
				received_date Date,
				received_at   DateTime,
				received_us   UInt64,
				cluster       LowCardinality(String),
				source        LowCardinality(String),
				reason        String,
				raw           String,
				raw_hash      UInt64
			) ENGINE = ReplacingMergeTree()
			PARTITION BY received_date
			ORDER BY (cluster, received_us, raw_hash)`,
		},
	},
	{
		Version: 2,
		Name:    "request_rollup: hourly request counters for the report",
		Statements: append([]string{
			// Hourly counters per object and writer, one row per request
			// (ResponseComplete or Panic, no dry runs), with each 409
			// classified once (analytics/sql). LowCardinality columns keep the
			// types of events: a view cannot convert them on 18.16.
			// Retention drops its day partitions with those of events.
			`CREATE TABLE IF NOT EXISTS {db}.request_rollup (
				event_date                    Date,
				hour                          DateTime,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				namespace                     LowCardinality(String),
				name                          String,
				writer                        LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = SummingMergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, api_group, resource, namespace, name, writer)`,
			// The view's text is fixed: a released migration must not change
			// meaning. It spells out analytics/sql's definitions (a request,
			// a write, the conflict classes, the counters) as they stood at
			// version 2; TestRollupEqualsRaw (analytics/report) proves the
			// rollup still agrees with them. ClickHouse lets an alias be
			// defined inside the expression that first uses it, so is_write
			// and class are defined in the first counters that need them.
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.request_rollup_mv TO {db}.request_rollup AS
			SELECT event_date, toDateTime(intDiv(event_time_us, 3600000000) * 3600) AS hour,
				cluster, api_group, resource, namespace, name, writer,
				count() AS requests,
				countIf((verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io')) AS is_write) AS write_attempts,
				countIf((multiIf(code != 409, '',
					has(cause_reasons, 'FieldManagerConflict'), 'field',
					reason = 'AlreadyExists', 'already_exists',
					reason = 'Conflict' AND position(message, 'the object has been modified; please apply your changes to the latest version and try again') > 0, 'version',
					reason = 'Conflict' AND verb IN ('delete', 'deletecollection') AND match(message, '(UID|ResourceVersion) in the precondition .* does not match'), 'delete_precondition',
					'other') AS class) = 'version') AS version_conflicts,
				countIf(is_write AND class = 'version') AS write_version_conflicts,
				countIf(class = 'field') AS field_conflicts,
				countIf(class = 'already_exists') AS already_exists,
				countIf(class = 'delete_precondition') AS delete_precondition_conflicts,
				countIf(verb = 'update' AND code >= 200 AND code < 300 AND stamp = '') AS stampless_updates,
				countIf(class = 'other') AS other_conflicts,
				countIf(code = 410) AS gone
			FROM {db}.events
			WHERE stage IN ('ResponseComplete', 'Panic') AND dry_run = 0
			GROUP BY event_date, hour, cluster, api_group, resource, namespace, name, writer`,
		}, epoch("request_rollup_epoch")...),
	},
	{
		Version: 3,
		Name:    "loop_conflicts, loop_successes: the rows retry loops are made of",
		Statements: append([]string{
			// Retry loops need, per (writer, object), the version
			// conflicts and the successful writes in time order. Read from
			// events, the few objects with conflicts are the busiest ones,
			// so the report read much of the day. These two narrow tables
			// hold just those rows, one per request, ordered for a lookup by
			// writer and object.
			`CREATE TABLE IF NOT EXISTS {db}.loop_conflicts (
				event_date    Date,
				cluster       LowCardinality(String),
				writer        LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				event_time_us UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, writer, api_group, resource, namespace, name, event_time_us)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.loop_conflicts_mv TO {db}.loop_conflicts AS
			SELECT event_date, cluster, writer, api_group, resource, namespace, name, event_time_us
			FROM {db}.events
			WHERE stage IN ('ResponseComplete', 'Panic') AND dry_run = 0
				AND verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io')
				AND code = 409 AND reason = 'Conflict' AND NOT has(cause_reasons, 'FieldManagerConflict')
				AND position(message, 'the object has been modified; please apply your changes to the latest version and try again') > 0`,
			// Successes are most writes, so they keep only a hash of
			// (writer, object): a lookup of a few hundred pairs then compares
			// integers, and small granules keep it from reading neighbours.
			`CREATE TABLE IF NOT EXISTS {db}.loop_successes (
				event_date    Date,
				cluster       LowCardinality(String),
				pair          UInt64,
				event_time_us UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, pair, event_time_us)
			SETTINGS index_granularity = 1024`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.loop_successes_mv TO {db}.loop_successes AS
			SELECT event_date, cluster, cityHash64(writer, api_group, resource, namespace, name) AS pair, event_time_us
			FROM {db}.events
			WHERE stage IN ('ResponseComplete', 'Panic') AND dry_run = 0
				AND verb IN ('create', 'update', 'patch', 'delete', 'deletecollection') AND api_group NOT IN ('authentication.k8s.io', 'authorization.k8s.io')
				AND code >= 200 AND code < 300`,
		}, epoch("loop_epoch")...),
	},
	{
		Version: 4,
		Name:    "stored_keys, duplicate_events: exact counts under concurrent writers",
		Statements: []string{
			// One row per stored copy of an event: a plain MergeTree never
			// collapses, so count() per key is how often the key was
			// inserted, and so how often every view counted it. A copy
			// beyond the first can only come from two writers racing past
			// the key lookup (docs/auditsink.md, "Exactly once").
			`CREATE TABLE IF NOT EXISTS {db}.stored_keys (
				event_date  Date,
				cluster     LowCardinality(String),
				audit_id    String,
				stage       LowCardinality(String),
				fingerprint UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, audit_id, stage, fingerprint)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.stored_keys_mv TO {db}.stored_keys
			AS SELECT event_date, cluster, audit_id, stage, fingerprint FROM {db}.events`,
			// stored_keys answers the writer's lookup from now on (with
			// event_keys for the events stored before this migration), so
			// event_keys_mv goes: one table fewer written per insert.
			`DROP TABLE IF EXISTS {db}.event_keys_mv`,
			// One row per event stored more than once, with the event's own
			// columns and how many copies were seen: the report subtracts
			// copies-1 times the event's counters (computed with the same
			// definitions as the views) from the rollups. Several writers
			// may record the same duplicate; the highest count wins.
			`CREATE TABLE IF NOT EXISTS {db}.duplicate_events (
				event_date          Date,
				event_time          DateTime,
				event_time_us       UInt64,
				request_received_us UInt64,
				latency_us          UInt64,
				cluster             LowCardinality(String),
				audit_id            String,
				stage               LowCardinality(String),
				fingerprint         UInt64,
				level               LowCardinality(String),
				verb                LowCardinality(String),
				request_uri         String,
				dry_run             UInt8,
				user                LowCardinality(String),
				user_groups         Array(String),
				impersonated_user   LowCardinality(String),
				writer              LowCardinality(String),
				user_agent          LowCardinality(String),
				source_ip           String,
				api_group           LowCardinality(String),
				api_version         LowCardinality(String),
				resource            LowCardinality(String),
				subresource         LowCardinality(String),
				namespace           LowCardinality(String),
				name                String,
				object_uid          String,
				stamp               String,
				field_manager       LowCardinality(String),
				code                UInt16,
				reason              LowCardinality(String),
				message             String,
				cause_reasons       Array(String),
				cause_fields        Array(String),
				authz_decision      LowCardinality(String),
				annotation_keys     Array(String),
				annotation_values   Array(String),
				lease_holder        String,
				raw                 String,
				copies              UInt32
			) ENGINE = ReplacingMergeTree(copies)
			PARTITION BY event_date
			ORDER BY (cluster, audit_id, stage, fingerprint)`,
		},
	},
	{
		Version: 5,
		Name:    "hour caches: exact by construction",
		Statements: []string{
			// The views of migrations 2-4 counted every inserted copy of
			// an event, so that exactness needed a protocol between the
			// writers (a lookup, a check, recorded duplicates and a read-time
			// correction). From here on an insert writes events and one
			// mark per hour it touched, nothing else; every figure is read
			// from events deduplicated by identity, or from an hour's cache
			// built from them (docs/auditsink.md, "Exactly once"). The old
			// tables stay, unfed, for sinks of older versions still running
			// during an upgrade; nothing reads them.
			`DROP TABLE IF EXISTS {db}.request_rollup_mv`,
			`DROP TABLE IF EXISTS {db}.loop_conflicts_mv`,
			`DROP TABLE IF EXISTS {db}.loop_successes_mv`,
			`DROP TABLE IF EXISTS {db}.stored_keys_mv`,
			// One row per inserted block and hour it touched: the view
			// writes it after the block's events part, in the same INSERT,
			// so a mark is never visible before its events are. The mark
			// is a hash of the block's identities in that hour: the same
			// events inserted again (a redelivery) add the same mark.
			// marked_at is the inserting server's clock: a compaction
			// waits until an hour's marks have settled (Store.Compact).
			`CREATE TABLE IF NOT EXISTS {db}.hour_marks (
				event_date Date,
				hour       DateTime,
				mark       UInt64,
				marked_at  DateTime
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (hour, mark)`,
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.hour_marks_mv TO {db}.hour_marks AS
			SELECT event_date, toDateTime(intDiv(event_time_us, 3600000000) * 3600) AS hour,
				cityHash64(sum(cityHash64(cluster, audit_id, stage, fingerprint)), count()) AS mark, now() AS marked_at
			FROM {db}.events
			GROUP BY event_date, hour`,
			// The hours stored before this migration get one mark each, so
			// that the compactor builds their caches too.
			`INSERT INTO {db}.hour_marks (event_date, hour, mark, marked_at)
			SELECT event_date, toDateTime(intDiv(event_time_us, 3600000000) * 3600) AS hour, cityHash64('stored before migration 5', toUInt32(hour)) AS mark, now() AS marked_at
			FROM {db}.events
			GROUP BY event_date, hour`,
			// One row per finished compaction of an hour: the hour's caches
			// with this version hold every event of the marks counted.
			// An hour is clean while its distinct marks number marks.
			`CREATE TABLE IF NOT EXISTS {db}.hour_compactions (
				event_date   Date,
				hour         DateTime,
				version      UInt64,
				marks        UInt64,
				compacted_at DateTime
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (hour, version)`,
			// The caches, one set of rows per (hour, version): the request
			// counters per object and writer, and the rows retry loops are
			// made of. Rows of a version without a compaction row (a
			// compactor that died) are never read.
			`CREATE TABLE IF NOT EXISTS {db}.hour_requests (
				event_date                    Date,
				hour                          DateTime,
				version                       UInt64,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				namespace                     LowCardinality(String),
				name                          String,
				writer                        LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, writer)`,
			`CREATE TABLE IF NOT EXISTS {db}.hour_loop_conflicts (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				writer        LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				event_time_us UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, writer, api_group, resource, namespace, name, event_time_us)`,
			`CREATE TABLE IF NOT EXISTS {db}.hour_loop_successes (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				pair          UInt64,
				event_time_us UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, pair, event_time_us)
			SETTINGS index_granularity = 1024`,
		},
	},
	{
		Version: 6,
		Name:    "events_by_hour: events sorted by hour first",
		Statements: []string{
			// events is sorted by object, so a read of a time range reads
			// its columns for whole day partitions: the raw edges of a
			// window and the open hour cost a day's scan. events_by_hour
			// holds the same columns sorted by cluster and hour first, so
			// a window reads its hours' granules only (every window
			// condition names the key's hour expression, TimeRange: 18.16
			// derives no key range through intDiv). Writers store here from
			// now on. events keeps what was stored before, and what sinks of
			// older versions still running during an upgrade store; every
			// read takes both tables, one row per identity (DistinctEvents),
			// so an event in both counts once, and no copy is needed:
			// retention empties events with time.
			`CREATE TABLE IF NOT EXISTS {db}.events_by_hour ` + eventsColumnsDDL + ` ENGINE = ReplacingMergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, intDiv(event_time_us, 3600000000), api_group, resource, namespace, name, event_time_us, audit_id, stage, fingerprint)`,
			// The same marks as hour_marks_mv's, for blocks stored here.
			`CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.hour_marks_by_hour_mv TO {db}.hour_marks AS
			SELECT event_date, toDateTime(intDiv(event_time_us, 3600000000) * 3600) AS hour,
				cityHash64(sum(cityHash64(cluster, audit_id, stage, fingerprint)), count()) AS mark, now() AS marked_at
			FROM {db}.events_by_hour
			GROUP BY event_date, hour`,
		},
	},
	{
		Version: 7,
		Name:    "minute_requests: the request counters per minute",
		Statements: []string{
			// hour_requests per minute, written by the same compaction
			// under the same version: a window that cuts a clean hour
			// reads the whole minutes it holds from here and only the
			// seconds at its edges from events. Versions compacted before
			// have no rows here, and a window cutting their hours reads
			// them from events as before.
			`CREATE TABLE IF NOT EXISTS {db}.minute_requests (
				event_date                    Date,
				hour                          DateTime,
				version                       UInt64,
				minute                        DateTime,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				namespace                     LowCardinality(String),
				name                          String,
				writer                        LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, minute, api_group, resource, namespace, name, writer)`,
		},
	},
	{
		Version: 8,
		Name:    "hour_writer_requests, minute_writer_requests: the request counters per writer and resource",
		Statements: []string{
			// hour_requests and minute_requests summed over namespaces and
			// objects, written by the same compaction under the same
			// version: the report's totals and its conflicts by writer
			// and by resource read a few thousand rows an hour here
			// instead of one per object. Every compaction of this release
			// writes one row with no cluster (which no read matches), so
			// that a version with any row here has both tables, and its
			// minute caches too; versions compacted before have none and
			// are read from the object caches as before.
			`CREATE TABLE IF NOT EXISTS {db}.hour_writer_requests (
				event_date                    Date,
				hour                          DateTime,
				version                       UInt64,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				writer                        LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, writer)`,
			`CREATE TABLE IF NOT EXISTS {db}.minute_writer_requests (
				event_date                    Date,
				hour                          DateTime,
				version                       UInt64,
				minute                        DateTime,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				writer                        LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, minute, api_group, resource, writer)`,
		},
	},
	{
		Version: 9,
		Name:    "hour_caches, the agent and latency caches: a record names the layout of its caches",
		Statements: []string{
			// One row per finished compaction of an hour, as in
			// hour_compactions, with the layout of the caches it wrote
			// (analytics/sql's CacheLayout): a reader takes only records
			// of its own layout, so every clean hour it reads has every
			// cache it reads, and an hour compacted by an earlier release
			// is read from events until this release compacts it again
			// (StaleHours lists it). hour_compactions keeps the records
			// of earlier releases, for their readers during an upgrade.
			`CREATE TABLE IF NOT EXISTS {db}.hour_caches (
				event_date   Date,
				hour         DateTime,
				layout       UInt32,
				version      UInt64,
				marks        UInt64,
				compacted_at DateTime
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (hour, layout, version)`,
			// The request counters per user agent, beside the writer and
			// namespace (the panel of conflicts by user agent), per hour
			// and per minute.
			`CREATE TABLE IF NOT EXISTS {db}.hour_agent_requests (
				event_date                    Date,
				hour                          DateTime,
				version                       UInt64,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				namespace                     LowCardinality(String),
				writer                        LowCardinality(String),
				user_agent                    LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, writer, user_agent)`,
			`CREATE TABLE IF NOT EXISTS {db}.minute_agent_requests (
				event_date                    Date,
				hour                          DateTime,
				version                       UInt64,
				minute                        DateTime,
				cluster                       LowCardinality(String),
				api_group                     LowCardinality(String),
				resource                      LowCardinality(String),
				namespace                     LowCardinality(String),
				writer                        LowCardinality(String),
				user_agent                    LowCardinality(String),
` + counterColumnsDDL + `			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, minute, api_group, resource, namespace, writer, user_agent)`,
			// The write latencies per minute: how many writes took each
			// latency (in microseconds, as events keep it), so that a
			// weighted quantile over these rows is the exact quantile over
			// the writes (the panel of write latency).
			`CREATE TABLE IF NOT EXISTS {db}.minute_write_latencies (
				event_date Date,
				hour       DateTime,
				version    UInt64,
				minute     DateTime,
				cluster    LowCardinality(String),
				api_group  LowCardinality(String),
				resource   LowCardinality(String),
				namespace  LowCardinality(String),
				writer     LowCardinality(String),
				latency_us UInt64,
				writes     UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, minute, api_group, resource, namespace, writer, latency_us)`,
		},
	},
}
