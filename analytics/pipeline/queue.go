package pipeline

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/stampguard/stampguard/analytics/spool"
)

// Source is what a Drainer drains: encoded records in order, each batch
// confirmed once ClickHouse stored it, in order. *spool.Spool is the
// sink's; a Queue is that of ingest and tail, whose log files are their
// durable buffer. Next returns io.EOF once a source is closed and empty
// (the Drainer then finishes its inserts and returns), or spool.ErrClosed
// (the Drainer returns without confirming what is in flight). Next waits
// only while it has nothing to hand over: with a ctx already done it still
// returns the records it holds (the Drainer relies on this to take what is
// there without waiting).
type Source interface {
	Next(ctx context.Context, maxRecords int) (spool.Batch, error)
	Confirm(end spool.Position) error
}

var _ Source = (*spool.Spool)(nil)

// Queue is a bounded in-memory Source: Append blocks while the queue holds
// MaxBytes of records not yet handed out, and Confirm passes the mark of
// the last confirmed append that had one to Confirmed (a tail's log file
// checkpoint). Positions are append sequence numbers (in Offset).
type Queue struct {
	max       int
	confirmed func(mark any) error

	mu      sync.Mutex
	queued  []queued // not handed out yet
	bytes   int      // of queued
	marks   []queued // handed out, with a mark, not yet confirmed
	seq     int64
	closed  bool
	arrived chan struct{} // a record was appended or the queue closed
	left    chan struct{} // records were handed out
}

type queued struct {
	rec  []byte
	seq  int64
	mark any
}

// NewQueue makes a queue holding up to maxBytes of records (at least one
// record whatever its size); confirmed may be nil.
func NewQueue(maxBytes int, confirmed func(mark any) error) *Queue {
	return &Queue{max: maxBytes, confirmed: confirmed, arrived: make(chan struct{}, 1), left: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// errQueueClosed is Append's error after Close.
var errQueueClosed = errors.New("queue closed")

// Append queues rec (which the queue then owns) with an optional mark,
// waiting for room until ctx ends.
func (q *Queue) Append(ctx context.Context, rec []byte, mark any) error {
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return errQueueClosed
		}
		if len(q.queued) == 0 || q.bytes+len(rec) <= q.max {
			q.seq++
			q.queued = append(q.queued, queued{rec: rec, seq: q.seq, mark: mark})
			q.bytes += len(rec)
			q.mu.Unlock()
			signal(q.arrived)
			return nil
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-q.left:
		}
	}
}

// Close ends the input: Next returns io.EOF once the queued records are
// handed out.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	signal(q.arrived)
}

// Next hands out up to maxRecords queued records, waiting for one until
// ctx ends.
func (q *Queue) Next(ctx context.Context, maxRecords int) (spool.Batch, error) {
	for {
		q.mu.Lock()
		if n := min(len(q.queued), max(maxRecords, 1)); n > 0 {
			b := spool.Batch{Records: make([][]byte, n)}
			for i, e := range q.queued[:n] {
				b.Records[i] = e.rec
				q.bytes -= len(e.rec)
				if e.mark != nil {
					q.marks = append(q.marks, queued{seq: e.seq, mark: e.mark})
				}
			}
			b.End = spool.Position{Offset: q.queued[n-1].seq}
			clear(q.queued[:n])
			q.queued = q.queued[n:]
			closed := q.closed
			q.mu.Unlock()
			signal(q.left)
			if closed {
				signal(q.arrived) // the next call returns io.EOF promptly
			}
			return b, nil
		}
		if q.closed {
			q.mu.Unlock()
			return spool.Batch{}, io.EOF
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return spool.Batch{}, ctx.Err()
		case <-q.arrived:
		}
	}
}

// Confirm passes the mark of the last confirmed record with one, if any,
// to the confirmed callback.
func (q *Queue) Confirm(end spool.Position) error {
	q.mu.Lock()
	var mark any
	i := 0
	for ; i < len(q.marks) && q.marks[i].seq <= end.Offset; i++ {
		mark = q.marks[i].mark
	}
	q.marks = q.marks[i:]
	q.mu.Unlock()
	if mark == nil || q.confirmed == nil {
		return nil
	}
	return q.confirmed(mark)
}
