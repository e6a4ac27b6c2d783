package analytics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stampguard/stampguard/analytics/spool"
)

// Inserter stores rows and dead letters exactly once; *Store is one.
type Inserter interface {
	Insert(ctx context.Context, rows []Row, dead []DeadLetter) (InsertResult, error)
}

var _ Inserter = (*Store)(nil)

// WriterOptions configure a Writer.
type WriterOptions struct {
	// MaxRecords caps the spool records per insert; defaulted to 50.
	MaxRecords int
	// MinBackoff and MaxBackoff bound the wait between failed inserts;
	// defaulted to 200ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	Metrics                *Metrics
	Logger                 *slog.Logger
}

// Writer drains the spool into ClickHouse: it reads unconfirmed records,
// inserts them (the store drops what is already stored), and confirms them
// only after the insert succeeded. A crash between insert and confirm
// replays the records, and the store's event_keys lookup drops them, so
// nothing is doubled.
type Writer struct {
	spool *spool.Spool
	store Inserter
	o     WriterOptions
}

// NewWriter makes a writer; call Run.
func NewWriter(sp *spool.Spool, st Inserter, o WriterOptions) *Writer {
	if o.MaxRecords <= 0 {
		o.MaxRecords = 50
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 200 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Writer{spool: sp, store: st, o: o}
}

// Run drains until ctx is done or the spool is closed. Insert errors are
// retried with backoff forever: the spool keeps accepting (up to its size)
// while ClickHouse is away.
func (w *Writer) Run(ctx context.Context) error {
	for {
		w.gauge()
		b, err := w.spool.Next(ctx, w.o.MaxRecords)
		if err != nil {
			if errors.Is(err, spool.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read spool: %w", err)
		}
		var rows []Row
		var dead []DeadLetter
		for _, rec := range b.Records {
			batch, err := DecodeBatch(string(rec))
			if err != nil {
				// The spool's checksum matched, so this is a record from a
				// newer or broken sink: keep it visible, do not block.
				w.o.Logger.Error("undecodable spool record; dead-lettering it", "err", err)
				dead = append(dead, DeadLetter{Source: "spool", Reason: err.Error(), Raw: string(sample(rec)), ReceivedAt: time.Now().UnixMicro()})
				continue
			}
			rows = append(rows, batch.Rows...)
			dead = append(dead, batch.Dead...)
		}
		if err := w.insert(ctx, rows, dead); err != nil {
			return nil // ctx done; unconfirmed records replay next time
		}
		if err := w.spool.Confirm(b.End); err != nil {
			return fmt.Errorf("confirm spool: %w", err)
		}
	}
}

func (w *Writer) insert(ctx context.Context, rows []Row, dead []DeadLetter) error {
	backoff := w.o.MinBackoff
	for {
		start := time.Now()
		res, err := w.store.Insert(ctx, rows, dead)
		if err == nil {
			if m := w.o.Metrics; m != nil {
				m.FlushSeconds.Observe(time.Since(start).Seconds())
				m.Stored.Add(float64(res.Stored))
				m.Deduplicated.Add(float64(res.Duplicates))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if w.o.Metrics != nil {
			w.o.Metrics.CHErrors.Inc()
		}
		w.o.Logger.Warn("ClickHouse insert failed; retrying", "err", err, "rows", len(rows), "retry_in", backoff)
		w.gauge()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, w.o.MaxBackoff)
	}
}

func (w *Writer) gauge() {
	if w.o.Metrics != nil {
		w.o.Metrics.SpoolBytes.Set(float64(w.spool.Stats().BytesOnDisk))
	}
}
