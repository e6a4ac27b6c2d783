package store

// historyMigrations are 10 and on: the field history of every write
// logged with its response (field_versions) and the caches its findings
// read, per hour and per block of hours (analytics/sql, history_hours.go
// and history_blocks.go), apart from schema.go's migrations of the
// events. Migrations lists both, in order.
var historyMigrations = []Migration{
	{
		Version: 10,
		Name:    "field_versions: the field history of every write logged with its response",
		Statements: []string{
			// One row per successful create, update or patch logged at
			// RequestResponse (internal/audit, fields.go): the version of
			// the object it stored, the fields that version shows with
			// keyed hashes of their values, and how the write was based
			// (the stamp it sent, a patch, an apply with or without force, whether it
			// sent the managedFields it had read). Sorted by object and
			// version, so one object's history is one range and the
			// versions are in order. A row is a function of its event, so
			// a copy (a redelivery, a racing writer, a retried insert) is
			// the same row, which reads take once per identity, as they
			// take events. The insert writes these rows before the
			// event's own: an event stored means its history is.
			`CREATE TABLE IF NOT EXISTS {db}.field_versions (
				event_date          Date,
				cluster             LowCardinality(String),
				api_group           LowCardinality(String),
				resource            LowCardinality(String),
				namespace           LowCardinality(String),
				name                String,
				object_version      UInt64,
				event_time_us       UInt64,
				request_received_us UInt64,
				audit_id            String,
				stage               LowCardinality(String),
				fingerprint         UInt64,
				verb                LowCardinality(String),
				subresource         LowCardinality(String),
				writer              LowCardinality(String),
				field_manager       LowCardinality(String),
				stamp               String,
				full_view           UInt8,
				request_managed     UInt8,
				force               UInt8,
				apply               UInt8,
				created             UInt8,
				field_paths         Array(String),
				field_hashes        Array(UInt64)
			) ENGINE = ReplacingMergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, api_group, resource, namespace, name, object_version, audit_id, stage, fingerprint)`,
		},
	},
	{
		Version: 11,
		Name:    "hour_field_changes, hour_field_bounds, hour_object_bounds: the field changes per hour",
		Statements: []string{
			// The field changes of each hour computed alone, written by
			// the compaction under the hour's version (analytics/sql,
			// history_hours.go): the changes that come out as from the
			// whole history, and per object field and per object what
			// stitching the hours in version order needs. A record of
			// layout 11 or later has them.
			`CREATE TABLE IF NOT EXISTS {db}.hour_field_changes (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				object_hash UInt64,
				field         String,
				writer        LowCardinality(String),
				time_us       UInt64,
				audit_id      String,
				basis         LowCardinality(String),
				prev_writer   LowCardinality(String),
				prev_time_us  UInt64,
				prev_audit_id String,
				removed_added UInt8,
				item_removed  UInt8
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, field, time_us)`,
			`CREATE TABLE IF NOT EXISTS {db}.hour_field_bounds (
				event_date        Date,
				hour              DateTime,
				version           UInt64,
				cluster           LowCardinality(String),
				api_group         LowCardinality(String),
				resource          LowCardinality(String),
				namespace         LowCardinality(String),
				name              String,
				object_hash UInt64,
				field             String,
				first_version     UInt64,
				first_vals        Array(UInt64),
				first_writer      LowCardinality(String),
				first_time_us     UInt64,
				first_audit_id    String,
				first_basis       LowCardinality(String),
				has_next          UInt8,
				next_vals         Array(UInt64),
				next_before       Array(UInt64),
				next_writer       LowCardinality(String),
				next_time_us      UInt64,
				next_audit_id     String,
				next_basis        LowCardinality(String),
				has_last          UInt8,
				last_set_vals     Array(UInt64),
				last_set_before   Array(UInt64),
				last_set_writer   LowCardinality(String),
				last_set_time_us  UInt64,
				last_set_audit_id String,
				end_vals          Array(UInt64)
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, field)`,
			`CREATE TABLE IF NOT EXISTS {db}.hour_object_bounds (
				event_date           Date,
				hour                 DateTime,
				version              UInt64,
				cluster              LowCardinality(String),
				api_group            LowCardinality(String),
				resource             LowCardinality(String),
				namespace            LowCardinality(String),
				name                 String,
				object_hash UInt64,
				min_version          UInt64,
				max_version          UInt64,
				min_full             UInt8,
				max_full             UInt8,
				min_created          UInt8,
				has_whole            UInt8,
				whole_version        UInt64,
				whole_writer         LowCardinality(String),
				whole_time_us        UInt64,
				whole_audit_id       String,
				whole_basis          LowCardinality(String),
				has_create           UInt8,
				next_create_writer   LowCardinality(String),
				next_create_time_us  UInt64,
				next_create_audit_id String,
				has_last_create      UInt8,
				last_create_writer   LowCardinality(String),
				last_create_time_us  UInt64,
				last_create_audit_id String,
				fields               Array(String)
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name)`,
		},
	},
	{
		Version: 12,
		Name:    "hour_version_conflicts: the version conflicts per hour with their stamps",
		Statements: []string{
			// The version conflicts of each hour, one row per request,
			// with what conflict_causes reads of them (the stamp the
			// loser sent, its audit ID, its verb), written by the
			// compaction under the hour's version (analytics/sql,
			// hours.go). A record of layouts 12 to 14 has them; from
			// layout 15 on, hour_conflict_blockers holds them.
			`CREATE TABLE IF NOT EXISTS {db}.hour_version_conflicts (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				event_time_us UInt64,
				writer        LowCardinality(String),
				verb          LowCardinality(String),
				audit_id      String,
				stamp         String
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, event_time_us)`,
		},
	},
	{
		Version: 13,
		Name:    "block_caches, block_field_changes, block_field_bounds, block_object_bounds: the field changes per block of hours",
		Statements: []string{
			// Blocks of clean hours (analytics/sql, history_blocks.go):
			// the stitch of their hours' field bounds, built by the
			// compaction under a version of their own, with the columns
			// of the hours' (and, per object, whether its hours interleave
			// within the block). A block is read only through its record,
			// which names the versions of its hours it was built from. The
			// columns are written out again, not shared with migration 11:
			// a released migration's text never changes (Migrations).
			`CREATE TABLE IF NOT EXISTS {db}.block_field_changes (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				object_hash UInt64,
				field         String,
				writer        LowCardinality(String),
				time_us       UInt64,
				audit_id      String,
				basis         LowCardinality(String),
				prev_writer   LowCardinality(String),
				prev_time_us  UInt64,
				prev_audit_id String,
				removed_added UInt8,
				item_removed  UInt8
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, field, time_us)`,
			`CREATE TABLE IF NOT EXISTS {db}.block_field_bounds (
				event_date        Date,
				hour              DateTime,
				version           UInt64,
				cluster           LowCardinality(String),
				api_group         LowCardinality(String),
				resource          LowCardinality(String),
				namespace         LowCardinality(String),
				name              String,
				object_hash UInt64,
				field             String,
				first_version     UInt64,
				first_vals        Array(UInt64),
				first_writer      LowCardinality(String),
				first_time_us     UInt64,
				first_audit_id    String,
				first_basis       LowCardinality(String),
				has_next          UInt8,
				next_vals         Array(UInt64),
				next_before       Array(UInt64),
				next_writer       LowCardinality(String),
				next_time_us      UInt64,
				next_audit_id     String,
				next_basis        LowCardinality(String),
				has_last          UInt8,
				last_set_vals     Array(UInt64),
				last_set_before   Array(UInt64),
				last_set_writer   LowCardinality(String),
				last_set_time_us  UInt64,
				last_set_audit_id String,
				end_vals          Array(UInt64)
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, field)`,
			`CREATE TABLE IF NOT EXISTS {db}.block_object_bounds (
				event_date           Date,
				hour                 DateTime,
				version              UInt64,
				cluster              LowCardinality(String),
				api_group            LowCardinality(String),
				resource             LowCardinality(String),
				namespace            LowCardinality(String),
				name                 String,
				object_hash UInt64,
				min_version          UInt64,
				max_version          UInt64,
				min_full             UInt8,
				max_full             UInt8,
				min_created          UInt8,
				has_whole            UInt8,
				whole_version        UInt64,
				whole_writer         LowCardinality(String),
				whole_time_us        UInt64,
				whole_audit_id       String,
				whole_basis          LowCardinality(String),
				has_create           UInt8,
				next_create_writer   LowCardinality(String),
				next_create_time_us  UInt64,
				next_create_audit_id String,
				has_last_create      UInt8,
				last_create_writer   LowCardinality(String),
				last_create_time_us  UInt64,
				last_create_audit_id String,
				fields               Array(String),
				interleaved          UInt8
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name)`,
			`CREATE TABLE IF NOT EXISTS {db}.block_caches (
				event_date   Date,
				hour         DateTime,
				hours        UInt8,
				version      UInt64,
				versions     Array(UInt64),
				compacted_at DateTime
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (hour, hours, version)`,
		},
	},
	{
		Version: 14,
		Name:    "hour_object_noops: the no-op writes per hour",
		Statements: []string{
			// The no-op writes of each hour, one row per object: its
			// no-ops by writer, its first and last version, and the
			// writer of its first version's first identity, with whether
			// that is a no-op already (analytics/sql, history_noops.go),
			// written by the compaction under the hour's version. A
			// record of layout 14 or later has them.
			`CREATE TABLE IF NOT EXISTS {db}.hour_object_noops (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				object_hash   UInt64,
				min_version   UInt64,
				max_version   UInt64,
				first_writer  LowCardinality(String),
				first_counted UInt8,
				noop_writers  Array(String),
				noop_counts   Array(UInt64)
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name)`,
		},
	},
	{
		Version: 15,
		Name:    "hour_conflict_blockers, hour_writer_versions: the version conflicts' blockers per hour",
		Statements: []string{
			// The version conflicts of each hour, one row per request,
			// with what conflict_causes reads of them and their in-hour
			// blockers: the writers whose writes of the hour, at or
			// before the conflict's time, stored a version later than
			// its stale stamp (analytics/sql, history_conflicts.go),
			// written by the compaction under the hour's version. A
			// record of layout 15 or later has them; they replace
			// hour_version_conflicts (migration 12).
			`CREATE TABLE IF NOT EXISTS {db}.hour_conflict_blockers (
				event_date    Date,
				hour          DateTime,
				version       UInt64,
				cluster       LowCardinality(String),
				api_group     LowCardinality(String),
				resource      LowCardinality(String),
				namespace     LowCardinality(String),
				name          String,
				event_time_us UInt64,
				stale         UInt64,
				writer        LowCardinality(String),
				verb          LowCardinality(String),
				audit_id      String,
				blockers      Array(String)
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, event_time_us)`,
			// The newest version each writer stored of each object in
			// each hour, written by the compaction under the hour's
			// version. A record of layout 15 or later has them.
			`CREATE TABLE IF NOT EXISTS {db}.hour_writer_versions (
				event_date  Date,
				hour        DateTime,
				version     UInt64,
				cluster     LowCardinality(String),
				api_group   LowCardinality(String),
				resource    LowCardinality(String),
				namespace   LowCardinality(String),
				name        String,
				writer      LowCardinality(String),
				max_version UInt64
			) ENGINE = MergeTree()
			PARTITION BY event_date
			ORDER BY (cluster, hour, version, api_group, resource, namespace, name, writer)`,
		},
	},
}
