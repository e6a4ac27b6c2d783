package store

import (
	"context"
	"fmt"

	"github.com/stampguard/stampguard/analytics/record"
)

// insertHistories stores the field histories of events' rows, if any, in
// blocks of insertBlockRows rows of one INSERT, encoded as the events are
// (record.Events.LoadHistories).
func (s *Store) insertHistories(ctx context.Context, events record.Events) error {
	if events.HistoryRows() == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+".field_versions ("+record.HistoryColumns+")")
	if err != nil {
		return fmt.Errorf("prepare field history insert: %w", err)
	}
	defer func() { _ = b.Abort() }() // after Send: a no-op that reports "already sent"
	if err := events.LoadHistories(b.Columns, insertBlockRows, b.Flush); err != nil {
		return fmt.Errorf("insert field histories: %w", err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert field histories: %w", err)
	}
	return nil
}
