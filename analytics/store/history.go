package store

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics/record"
)

// historyColumns are field_versions' columns, in the order of
// historyBlock's columns.
const historyColumns = "event_date, cluster, api_group, resource, namespace, name, object_version, event_time_us, request_received_us, " +
	"audit_id, stage, fingerprint, verb, subresource, writer, field_manager, stamp, full_view, request_managed, force, apply, created, field_paths, field_hashes"

// historyBlock holds up to insertBlockRows field history rows column by
// column, as the driver's columns take them whole: a row at a time
// through Batch.Append cost a tenth of serve's CPU on a mix of writes.
type historyBlock struct {
	days                                                  []time.Time
	clusters, groups, resources, namespaces, names        []string
	versions, times, received                             []uint64
	auditIDs, stages                                      []string
	fingerprints                                          []uint64
	verbs, subresources, writers, managers, stamps        []string
	fullViews, requestManaged, forces, applies, creations []uint8
	paths                                                 [][]string
	hashes                                                [][]uint64
}

func (c *historyBlock) add(h *record.HistoryRow) {
	c.days = append(c.days, time.UnixMicro(h.StageMicros).UTC().Truncate(24*time.Hour))
	c.clusters, c.groups, c.resources = append(c.clusters, h.Cluster), append(c.groups, h.APIGroup), append(c.resources, h.Resource)
	c.namespaces, c.names = append(c.namespaces, h.Namespace), append(c.names, h.Name)
	c.versions, c.times = append(c.versions, h.ObjectVersion), append(c.times, uint64(h.StageMicros))
	c.received = append(c.received, uint64(max(h.ReceivedMicros, 0)))
	c.auditIDs, c.stages, c.fingerprints = append(c.auditIDs, h.AuditID), append(c.stages, h.Stage), append(c.fingerprints, h.Fingerprint)
	c.verbs, c.subresources, c.writers = append(c.verbs, h.Verb), append(c.subresources, h.Subresource), append(c.writers, h.Writer)
	c.managers, c.stamps = append(c.managers, h.FieldManager), append(c.stamps, h.Stamp)
	c.fullViews, c.requestManaged = append(c.fullViews, boolByte(h.FullView)), append(c.requestManaged, boolByte(h.RequestManaged))
	c.forces, c.applies, c.creations = append(c.forces, boolByte(h.Force)), append(c.applies, boolByte(h.Apply)), append(c.creations, boolByte(h.Created))
	c.paths, c.hashes = append(c.paths, h.Paths), append(c.hashes, h.Hashes)
}

func (c *historyBlock) rows() int { return len(c.days) }

// columns are the block's columns in historyColumns' order.
func (c *historyBlock) columns() []any {
	return []any{c.days, c.clusters, c.groups, c.resources, c.namespaces, c.names, c.versions, c.times, c.received,
		c.auditIDs, c.stages, c.fingerprints, c.verbs, c.subresources, c.writers, c.managers, c.stamps,
		c.fullViews, c.requestManaged, c.forces, c.applies, c.creations, c.paths, c.hashes}
}

// insertHistories stores the field histories of events' rows, if any, in
// blocks of insertBlockRows rows of one INSERT.
func (s *Store) insertHistories(ctx context.Context, events record.Events) error {
	var b driver.Batch
	defer func() {
		if b != nil {
			_ = b.Abort() // after Send: a no-op that reports "already sent"
		}
	}()
	var block historyBlock
	load := func() error {
		for i, col := range block.columns() {
			if err := b.Column(i).Append(col); err != nil {
				return fmt.Errorf("field history column %d: %w", i, err)
			}
		}
		block = historyBlock{}
		return nil
	}
	err := events.Histories(func(h *record.HistoryRow) error {
		if b == nil {
			var err error
			if b, err = s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+".field_versions ("+historyColumns+")"); err != nil {
				return fmt.Errorf("prepare field history insert: %w", err)
			}
		}
		if block.rows() == insertBlockRows {
			if err := load(); err != nil {
				return err
			}
			if err := b.Flush(); err != nil {
				return err
			}
		}
		block.add(h)
		return nil
	})
	if err == nil && b != nil {
		err = load()
	}
	if err != nil {
		return fmt.Errorf("insert field histories: %w", err)
	}
	if b == nil {
		return nil
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert field histories: %w", err)
	}
	return nil
}
