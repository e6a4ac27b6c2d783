package store

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Sharded mode. On a ClickHouse cluster every table of the single-node
// schema becomes two: a Replicated*MergeTree table `<name>_local` on every
// node (its ZooKeeper path keyed by the {shard} and {replica} macros), and
// a Distributed table `<name>` over them. Code that reads and writes
// `{db}.<name>` therefore works unchanged: inserts into `events_by_hour` (and
// `events`) are sharded by object, so one object's events, and with them its retry
// loops and lease holders, live on one shard; the materialized views run
// on each shard's local event tables and fill that shard's local tables, so
// sums over the Distributed tables are exact. A few small tables are the
// same on every node (one replicated "global" table, no Distributed
// table): schema_migrations and the epochs.
//
// clusterDDL turns the single-node statements into that schema. It works
// on the project's own DDL (fixed shapes: CREATE TABLE IF NOT EXISTS
// {db}.name (...) ENGINE = X(...), CREATE MATERIALIZED VIEW IF NOT EXISTS
// {db}.name TO {db}.target AS SELECT ... FROM {db}.events, INSERT INTO,
// DROP, ALTER), and refuses anything else, so that a new statement shape
// fails its test instead of being rendered wrongly.
type clusterDDL struct {
	// cluster is the remote_servers name.
	cluster string
}

// Tables that hold the same rows on every node: one replica set spanning
// the cluster, no Distributed table.
func isGlobalTable(name string) bool {
	return name == "schema_migrations" || strings.HasSuffix(name, "_epoch")
}

// shardingKeys are the Distributed tables' sharding expressions for the
// tables that inserts reach through the Distributed table. Tables that
// only views fill are never inserted through their Distributed table.
var shardingKeys = map[string]string{
	"events":           "cityHash64(cluster, namespace, name)",
	"events_by_hour":   "cityHash64(cluster, namespace, name)",
	"duplicate_events": "cityHash64(cluster, namespace, name)",
	"field_versions":   "cityHash64(cluster, namespace, name)",
	"dead_letters":     "raw_hash",
}

// localSuffix names the per-node table behind a Distributed table.
const localSuffix = "_local"

var (
	reCreateDB    = regexp.MustCompile(`^CREATE DATABASE IF NOT EXISTS (\S+)$`)
	reCreateTable = regexp.MustCompile(`(?s)^CREATE TABLE IF NOT EXISTS \{db\}\.(\w+) (\(.*\))\s*ENGINE = (\w*MergeTree)\(([^)]*)\)(.*)$`)
	reCreateView  = regexp.MustCompile(`(?s)^CREATE MATERIALIZED VIEW IF NOT EXISTS \{db\}\.(\w+) TO \{db\}\.(\w+)(\s+AS\s.*)$`)
	reFromTable   = regexp.MustCompile(`\{db\}\.(\w+)`)
	reDrop        = regexp.MustCompile(`^DROP (TABLE|VIEW) IF EXISTS \{db\}\.(\w+)$`)
	reAlter       = regexp.MustCompile(`(?s)^ALTER TABLE \{db\}\.(\w+) (.*)$`)
)

// render returns the cluster statements for one single-node statement
// (still with {db} to fill in).
func (c *clusterDDL) render(stmt string) ([]string, error) {
	stmt = strings.TrimSpace(stmt)
	on := " ON CLUSTER " + c.cluster
	switch {
	case reCreateDB.MatchString(stmt):
		return []string{stmt + on}, nil
	case reCreateTable.MatchString(stmt):
		m := reCreateTable.FindStringSubmatch(stmt)
		name, cols, engine, args, rest := m[1], m[2], m[3], strings.TrimSpace(m[4]), m[5]
		local := name + localSuffix
		zkPath := "/clickhouse/tables/{shard}/{db}/" + name
		if isGlobalTable(name) {
			local, zkPath = name, "/clickhouse/tables/global/{db}/"+name
		}
		// A global table's one replica set spans the shards, so its
		// replica names must be unique across them.
		replica := "{replica}"
		if isGlobalTable(name) {
			replica = "{shard}-{replica}"
		}
		repArgs := "'" + zkPath + "', '" + replica + "'"
		if args != "" {
			repArgs += ", " + args
		}
		out := []string{"CREATE TABLE IF NOT EXISTS {db}." + local + on + " " + cols +
			"\n\tENGINE = Replicated" + engine + "(" + repArgs + ")" + rest}
		if !isGlobalTable(name) {
			key := shardingKeys[name]
			if key == "" {
				key = "rand()"
			}
			out = append(out, "CREATE TABLE IF NOT EXISTS {db}."+name+on+" AS {db}."+local+
				"\n\tENGINE = Distributed("+c.cluster+", {db}, "+local+", "+key+")")
		}
		return out, nil
	case reCreateView.MatchString(stmt):
		m := reCreateView.FindStringSubmatch(stmt)
		view, target, body := m[1], m[2], m[3]
		if isGlobalTable(target) {
			return nil, fmt.Errorf("sharded mode: view %s writes to the global table %s", view, target)
		}
		// The view reads each node's local tables: it sees the rows that
		// node stores, once.
		body = reFromTable.ReplaceAllStringFunc(body, func(t string) string {
			if isGlobalTable(strings.TrimPrefix(t, "{db}.")) {
				return t
			}
			return t + localSuffix
		})
		return []string{"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}." + view + on + " TO {db}." + target + localSuffix + body}, nil
	case reDrop.MatchString(stmt):
		m := reDrop.FindStringSubmatch(stmt)
		if isGlobalTable(m[2]) || strings.HasSuffix(m[2], "_mv") {
			return []string{stmt + on}, nil
		}
		return []string{
			"DROP TABLE IF EXISTS {db}." + m[2] + on,
			"DROP TABLE IF EXISTS {db}." + m[2] + localSuffix + on,
		}, nil
	case reAlter.MatchString(stmt):
		m := reAlter.FindStringSubmatch(stmt)
		name := m[1]
		if !isGlobalTable(name) {
			name += localSuffix
		}
		return []string{"ALTER TABLE {db}." + name + on + " " + m[2]}, nil
	case strings.HasPrefix(stmt, "INSERT INTO "):
		// Runs once, on the node the migration talks to: through the
		// Distributed tables it reads (and writes) the whole cluster.
		return []string{stmt}, nil
	}
	return nil, fmt.Errorf("sharded mode cannot render this statement; teach clusterDDL its shape: %.80q", stmt)
}

var clusterName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func newClusterDDL(name string) (*clusterDDL, error) {
	if !clusterName.MatchString(name) {
		return nil, fmt.Errorf("ClickHouse cluster name %q: want letters, digits and underscores, as in the servers' remote_servers", name)
	}
	return &clusterDDL{cluster: name}, nil
}

// applySettings sets what sharded mode needs on every query:
//   - insert_distributed_sync: an insert into a Distributed table returns
//     only once every shard stored its rows, so an acknowledged batch is
//     stored;
//   - prefer_localhost_replica 0: every node routes reads and writes to
//     the same replica of a shard (the first healthy one, with the
//     profile's load_balancing in_order), whichever node a sink is
//     connected to, so that reads see what the writes wrote;
//   - insert_deduplicate 0: a Replicated table drops a block identical to
//     a recent one, and an insert retried after it was applied in part
//     must still write its block's hour marks through the view.
//   - max_replica_delay_for_distributed_queries (replicaDelay) with
//     fallback_to_stale_replicas_for_distributed_queries 0: a read
//     through a Distributed table skips a replica that lags further
//     behind, and fails rather than read one, so a compaction, which
//     waits longer than that after an hour's last insert, sees every
//     part of the hour.
func (c *clusterDDL) applySettings(opts *clickhouse.Options) {
	if opts.Settings == nil {
		opts.Settings = clickhouse.Settings{}
	}
	opts.Settings["insert_distributed_sync"] = 1
	opts.Settings["prefer_localhost_replica"] = 0
	opts.Settings["insert_deduplicate"] = 0
	opts.Settings["max_replica_delay_for_distributed_queries"] = int(replicaDelay / time.Second)
	opts.Settings["fallback_to_stale_replicas_for_distributed_queries"] = 0
}

// replicaDelay is the most a replica may lag behind and still be read in
// sharded mode.
const replicaDelay = time.Minute

// profileSettings are settings sharded mode needs that are strings, which
// the native protocol of 18.16 cannot carry from a client (it sends
// settings as numbers), so they belong in the servers' default profile:
//   - load_balancing in_order: reads and (internal_replication) writes go
//     to the first healthy replica of each shard, so reads see the
//     replica that took the last insert while it is up;
//   - distributed_product_mode global: the report's IN and JOIN subqueries
//     over Distributed tables run once, on the node asked, and their result
//     goes to the shards (the hot-objects threshold and the loop candidates
//     are cluster-wide, not per shard).
var profileSettings = [][2]string{{"load_balancing", "in_order"}, {"distributed_product_mode", "global"}}

// checkProfile refuses, in sharded mode, a cluster whose profile lacks
// profileSettings. Migrate runs it (serve, ingest and tail migrate at
// start), so Open still dials nothing.
func (s *Store) checkProfile(ctx context.Context) error {
	if s.ddl == nil {
		return nil
	}
	for _, kv := range profileSettings {
		var v string
		if err := s.conn.QueryRow(ctx, "SELECT value FROM system.settings WHERE name = ?", kv[0]).Scan(&v); err != nil {
			return fmt.Errorf("read setting %s: %w", kv[0], err)
		}
		if v != kv[1] {
			return fmt.Errorf("sharded mode needs %s = '%s' in the default profile of every server (users.xml; docs/auditsink.md, \"ClickHouse cluster\"), the server has '%s'", kv[0], kv[1], v)
		}
	}
	return nil
}

// execDDL runs a schema statement with {db} filled in: as it is on one
// node, rendered for the cluster in sharded mode.
func (s *Store) execDDL(ctx context.Context, stmt string) error {
	stmts := []string{stmt}
	if s.ddl != nil {
		var err error
		if stmts, err = s.ddl.render(stmt); err != nil {
			return err
		}
	}
	for _, q := range stmts {
		if err := s.conn.Exec(ctx, strings.ReplaceAll(q, "{db}", s.db)); err != nil {
			return err
		}
	}
	return nil
}
