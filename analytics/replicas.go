package analytics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Exactly once on a cluster. A read through a Distributed table sees one
// replica of each shard, and a shard's replicas do not hold the same
// parts at every moment: an insert returns once one replica stored it, and
// the others fetch the part later. Which replica an insert or a read
// reaches depends on the node that runs it (each node ranks a shard's
// replicas by the connection errors it saw, then by load_balancing), so
// two sinks can store copies of one event on different replicas, and a
// sink whose replica came back after a failure reads it before it fetched
// what the other replica took meanwhile. A check through the Distributed
// stored_keys then sees one copy of an event stored twice.
//
// So in cluster mode the key lookups read stored_keys_local on every node,
// one branch per node (remote(), each node asked alone), and count the
// copies from the parts: each insert is one part with a block number that
// ZooKeeper allocates per shard, a merge joins a range of blocks, and a
// replica's part of a given range holds the same rows as another replica's.
// The copies of an event are the rows it has in the widest parts of its
// shard across the replicas (copiesInParts).

// nodesTTL is how long the list of the cluster's nodes is reused.
const nodesTTL = time.Minute

// clusterNodes caches the cluster's nodes from system.clusters.
type clusterNodes struct {
	mu   sync.Mutex
	list []string
	read time.Time
}

// nodes returns every server of the cluster as host:port, for remote().
func (c *clusterDDL) nodes(ctx context.Context, conn driver.Conn) ([]string, error) {
	c.nodeCache.mu.Lock()
	defer c.nodeCache.mu.Unlock()
	if c.nodeCache.list != nil && time.Since(c.nodeCache.read) < nodesTTL {
		return c.nodeCache.list, nil
	}
	rows, err := conn.Query(ctx, "SELECT host_address, port FROM system.clusters WHERE cluster = ?", c.cluster)
	if err != nil {
		return nil, fmt.Errorf("list the nodes of cluster %s: %w", c.cluster, err)
	}
	defer rows.Close()
	var addrs []string
	for rows.Next() {
		var host string
		var port uint16
		if err := rows.Scan(&host, &port); err != nil {
			return nil, err
		}
		if !safeHost.MatchString(host) {
			return nil, fmt.Errorf("cluster %s: unexpected host address %q", c.cluster, host)
		}
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		addrs = append(addrs, host+":"+strconv.Itoa(int(port)))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("cluster %s is not in the servers' remote_servers (system.clusters)", c.cluster)
	}
	c.nodeCache.list, c.nodeCache.read = addrs, time.Now()
	return addrs, nil
}

// everyReplicaKeys is a query that returns, for each key of stored_keys
// matching where (one condition per node), the parts that hold it on any node and its rows in
// each: columns cluster, audit_id, stage, fingerprint, parts
// Array(String), rows Array(UInt32). Each node counts its own parts; the
// same part on two replicas is listed once. onlyDoubled keeps the keys
// that may have more than one copy: in several parts, or twice in one.
func (s *Store) everyReplicaKeys(nodes, where []string, onlyDoubled bool) string {
	const key = "cl, audit_id, st, fingerprint"
	var b strings.Builder
	b.WriteString("SELECT " + key + ", groupArray(part), groupArray(n) FROM (\n\tSELECT " + key + ", part, max(n) AS n FROM (")
	for i, node := range nodes {
		if i > 0 {
			b.WriteString("\n\t\tUNION ALL")
		}
		b.WriteString("\n\t\tSELECT toString(cluster) AS cl, audit_id, toString(stage) AS st, fingerprint, _part AS part, toUInt32(count()) AS n FROM remote('" +
			node + "', " + s.db + ", stored_keys" + LocalSuffix + ")" + where[i] + " GROUP BY " + key + ", part")
	}
	b.WriteString("\n\t) GROUP BY " + key + ", part\n) GROUP BY " + key)
	if onlyDoubled {
		b.WriteString(" HAVING count() > 1 OR max(n) > 1")
	}
	return b.String()
}

// queryEveryReplica runs an everyReplicaKeys query built by q over nodes
// and calls found for each key with its copies. A node that does not
// answer makes the query fail; with skipDown the query then runs again
// over the nodes that answer, and partial reports that it did.
// (skip_unavailable_shards would do that on the server, but 18.16 fails a
// branch whose only shard is skipped.)
func (s *Store) queryEveryReplica(ctx context.Context, nodes []string, q func(nodes []string) (string, []any), skipDown bool, found func(eventKey, uint32)) (partial bool, err error) {
	run := func(nodes []string) error {
		query, args := q(nodes)
		res, err := s.conn.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		defer res.Close()
		for res.Next() {
			var k eventKey
			var parts []string
			var rows []uint32
			if err := res.Scan(&k.cluster, &k.auditID, &k.stage, &k.fingerprint, &parts, &rows); err != nil {
				return fmt.Errorf("scan event key: %w", err)
			}
			copies, err := copiesInParts(parts, rows)
			if err != nil {
				return err
			}
			found(k, copies)
		}
		return res.Err()
	}
	err = run(nodes)
	var exc *clickhouse.Exception
	if err == nil || !skipDown || !errors.As(err, &exc) {
		return false, err
	}
	// The node asked answered with an error: most likely another node is
	// down. Read the nodes that answer; the caller records the gap.
	up := s.answering(ctx, nodes)
	if len(up) == len(nodes) || len(up) == 0 {
		return false, err
	}
	if err := run(up); err != nil {
		return false, err
	}
	return true, nil
}

// answering returns the nodes that answer a query through remote().
func (s *Store) answering(ctx context.Context, nodes []string) []string {
	var up []string
	for _, n := range nodes {
		var one uint8
		if err := s.conn.QueryRow(ctx, "SELECT dummy FROM remote('"+n+"', system, one)").Scan(&one); err == nil {
			up = append(up, n)
		}
	}
	return up
}

// lookupEveryReplica is lookup in cluster mode: it reads stored_keys on
// every node. While a node is down it reads the others and marks the
// batch's days for a duplicate scan (a copy may be on the node that is
// down and nowhere else yet). event_keys, which only events stored before
// migration 4 are in, plays no part: cluster mode came later.
func (s *Store) lookupEveryReplica(ctx context.Context, cluster string, rows []rowRef, kq keyQuery, found func(eventKey, uint32)) error {
	nodes, err := s.ddl.nodes(ctx, s.conn)
	if err != nil {
		return err
	}
	keys, days, err := batchKeys(rows)
	if err != nil {
		return err
	}
	where := " WHERE event_date IN ? AND cluster = ? AND audit_id IN (SELECT audit_id FROM batch_keys)"
	q := func(nodes []string) (string, []any) {
		args := make([]any, 0, 2*len(nodes))
		for range nodes {
			args = append(args, clickhouse.GroupSet{Value: days}, cluster)
		}
		return s.everyReplicaKeys(nodes, slices.Repeat([]string{where}, len(nodes)), kq.doubled), args
	}
	if kq.doubled && !kq.since.IsZero() {
		ok, partial := s.checkRecentEveryReplica(ctx, nodes, keys, where, []any{clickhouse.GroupSet{Value: days}, cluster}, kq.since, found)
		if ok {
			if partial {
				s.pending.mark(rows)
			}
			return nil
		}
	}
	partial, err := s.queryEveryReplica(clickhouse.Context(ctx, clickhouse.WithExternalTable(keys)), nodes, q, true, found)
	if err != nil {
		return fmt.Errorf("look up stored event keys on every replica: %w", lookupError{err})
	}
	if partial {
		s.pending.mark(rows)
	}
	return nil
}

// checkRecentEveryReplica is checkRecentParts on every node: each node's
// branch names that node's parts of stored_keys_local written since the
// batch's lookup started (the lookup read every node, so it saw the
// copies stored before). ok is false when the whole check must run
// instead: a listing or the read failed, or a merge replaced a listed
// part meanwhile. partial: a node did not answer (the caller marks the
// batch for a scan, as for the whole check).
func (s *Store) checkRecentEveryReplica(ctx context.Context, nodes []string, keys *ext.Table, where string, args []any, since time.Time, found func(eventKey, uint32)) (ok, partial bool) {
	back := secondsBack(since, clusterRecentMargin)
	listed, err := s.partsEveryNode(ctx, nodes, "modification_time >= now() - ?", func(int) any { return back })
	if err != nil {
		up := s.answering(ctx, nodes)
		if len(up) == 0 || len(up) == len(nodes) {
			return false, false
		}
		if listed, err = s.partsEveryNode(ctx, up, "modification_time >= now() - ?", func(int) any { return back }); err != nil {
			return false, false
		}
		nodes, partial = up, true
	}
	var withParts, wheres []string
	var partsOf [][]any
	var qargs []any
	for i, n := range nodes {
		if len(listed[i]) == 0 {
			continue
		}
		withParts, partsOf = append(withParts, n), append(partsOf, listed[i])
		wheres = append(wheres, where+" AND _part IN ?")
		qargs = append(append(qargs, args...), clickhouse.GroupSet{Value: listed[i]})
	}
	if len(withParts) == 0 {
		return false, false // not even this batch's parts: check everything
	}
	q := func([]string) (string, []any) { return s.everyReplicaKeys(withParts, wheres, true), qargs }
	if _, err := s.queryEveryReplica(clickhouse.Context(ctx, clickhouse.WithExternalTable(keys)), withParts, q, false, found); err != nil {
		return false, false
	}
	still, err := s.partsEveryNode(ctx, withParts, "name IN ?", func(i int) any { return clickhouse.GroupSet{Value: partsOf[i]} })
	if err != nil {
		return false, false
	}
	for i := range withParts {
		if len(still[i]) != len(partsOf[i]) {
			return false, false
		}
	}
	return true, partial
}

// clusterRecentMargin is recentMargin on a cluster: a part's time is its
// node's clock, compared with that node's now(), and the batch's lookup
// started on the sink's clock; the margin also covers the sink's and the
// nodes' clocks disagreeing.
const clusterRecentMargin = 30 * time.Second

// partsEveryNode lists the active parts of stored_keys_local matching
// cond on each node (arg(i) is node i's argument), in one query.
func (s *Store) partsEveryNode(ctx context.Context, nodes []string, cond string, arg func(int) any) ([][]any, error) {
	var b strings.Builder
	args := make([]any, 0, len(nodes)+1)
	for i, n := range nodes {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&b, "SELECT toUInt32(%d) AS node, name FROM remote('%s', system, parts) WHERE database = ? AND table = 'stored_keys%s' AND active AND %s", i, n, LocalSuffix, cond)
		args = append(args, s.db, arg(i))
	}
	rows, err := s.conn.Query(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("list the parts of stored_keys on every node: %w", err)
	}
	defer rows.Close()
	out := make([][]any, len(nodes))
	for rows.Next() {
		var node uint32
		var name string
		if err := rows.Scan(&node, &name); err != nil {
			return nil, err
		}
		if int(node) < len(out) {
			out[node] = append(out[node], name)
		}
	}
	return out, rows.Err()
}

// scanEveryReplica is ScanDuplicates in cluster mode: the keys with more
// than one copy on any replica, counted from the parts, then their events.
// It needs every node: a scan that misses one proves nothing.
func (s *Store) scanEveryReplica(ctx context.Context, day string) error {
	nodes, err := s.ddl.nodes(ctx, s.conn)
	if err != nil {
		return err
	}
	doubled, err := ext.NewTable("doubled_keys",
		ext.Column("cluster", "String"), ext.Column("audit_id", "String"), ext.Column("stage", "String"),
		ext.Column("fingerprint", "UInt64"), ext.Column("copies", "UInt32"))
	if err != nil {
		return err
	}
	n := 0
	var appendErr error
	q := func(nodes []string) (string, []any) {
		args := make([]any, len(nodes))
		for i := range args {
			args[i] = day
		}
		return s.everyReplicaKeys(nodes, slices.Repeat([]string{" WHERE event_date >= toDate(?)"}, len(nodes)), true), args
	}
	if _, err := s.queryEveryReplica(ctx, nodes, q, false, func(k eventKey, copies uint32) {
		if copies > 1 && appendErr == nil {
			appendErr = doubled.Append(k.cluster, k.auditID, k.stage, k.fingerprint, copies)
			n++
		}
	}); err != nil {
		return fmt.Errorf("scan for duplicates on every replica: %w", err)
	}
	if appendErr != nil || n == 0 {
		return appendErr
	}
	key := "cluster, audit_id, stage, fingerprint"
	ins := `INSERT INTO ` + s.db + `.duplicate_events (` + EventColumns + `, copies)
	SELECT ` + EventColumns + `, copies FROM (
		SELECT ` + EventColumns + `, toString(cluster) AS cl, toString(stage) AS st FROM ` + s.db + `.events
		PREWHERE event_date >= toDate(?) AND (toString(cluster), audit_id, toString(stage), fingerprint) IN (
			SELECT ` + key + ` FROM doubled_keys)
		LIMIT 1 BY ` + key + `
	) AS e ANY INNER JOIN (
		SELECT cluster AS cl, audit_id, stage AS st, fingerprint, copies FROM doubled_keys
	) AS d USING (cl, audit_id, st, fingerprint)`
	if err := s.conn.Exec(clickhouse.Context(ctx, clickhouse.WithExternalTable(doubled)), ins, day); err != nil {
		return fmt.Errorf("record duplicates found on every replica: %w", err)
	}
	return nil
}

// copiesInParts counts an event's copies from the parts that hold it on
// some replica (names as in system.parts: partition_min_max_level, with
// _mutation after) and its rows in each. Block numbers are unique within a
// shard's table and a merged part covers a range of them, so a part
// inside another's range holds no rows the wider part lacks: the copies
// are the rows in the widest parts.
func copiesInParts(parts []string, rows []uint32) (uint32, error) {
	type blocks struct {
		partition string
		min, max  int64
	}
	ranges := make([]blocks, len(parts))
	for i, p := range parts {
		f := strings.Split(p, "_")
		if len(f) != 4 && len(f) != 5 {
			return 0, fmt.Errorf("part name %q: want partition_min_max_level", p)
		}
		lo, err1 := strconv.ParseInt(f[1], 10, 64)
		hi, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || lo > hi {
			return 0, fmt.Errorf("part name %q: block numbers", p)
		}
		ranges[i] = blocks{f[0], lo, hi}
	}
	var copies uint32
	for i, r := range ranges {
		widest := true
		for j, o := range ranges {
			if j == i || o.partition != r.partition || o.min > r.min || o.max < r.max {
				continue
			}
			// o covers r: r is not the widest, unless o is the same range
			// (one part at two merge levels, or on two replicas) and r
			// comes first.
			if o.min != r.min || o.max != r.max || j < i {
				widest = false
				break
			}
		}
		if widest {
			copies += rows[i]
		}
	}
	return copies, nil
}

// pendingScan remembers the earliest day of events whose check could not
// read every replica: a copy may sit on a node that was down, and the
// duplicate scan of those days, once every node answers, records it.
type pendingScan struct {
	mu   sync.Mutex
	from time.Time // zero: nothing pending
	gen  uint64
}

func (p *pendingScan) generation() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

func (p *pendingScan) mark(rows []rowRef) {
	first := rows[0].micros
	for _, r := range rows {
		first = min(first, r.micros)
	}
	day := time.UnixMicro(first).UTC().Truncate(24 * time.Hour)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.from.IsZero() || day.Before(p.from) {
		p.from = day
	}
	p.gen++
}

// ScanPending runs the duplicate scan over the days whose checks missed a
// node that was down, if any (it needs every node to answer, and can be
// called again until it does). It reports whether it scanned.
func (s *Store) ScanPending(ctx context.Context) (bool, error) {
	s.pending.mu.Lock()
	from, gen := s.pending.from, s.pending.gen
	s.pending.mu.Unlock()
	if from.IsZero() {
		return false, nil
	}
	if err := s.ScanDuplicates(ctx, from); err != nil {
		return false, err
	}
	s.pending.mu.Lock()
	if s.pending.gen == gen {
		s.pending.from = time.Time{}
	}
	s.pending.mu.Unlock()
	return true, nil
}

// ScanIsPending reports whether a check missed a node since the last
// ScanPending.
func (s *Store) ScanIsPending() bool {
	s.pending.mu.Lock()
	defer s.pending.mu.Unlock()
	return !s.pending.from.IsZero()
}
