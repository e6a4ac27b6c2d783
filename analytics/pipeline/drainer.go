package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
	"unsafe"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/analytics/store"
)

// Inserter stores the rows and dead letters of spool records exactly once;
// *Store is one. InsertRecords must not change the set: a failed insert is
// retried with it.
type Inserter interface {
	InsertRecords(ctx context.Context, set *record.Set) (store.InsertResult, error)
}

var _ Inserter = (*store.Store)(nil)

// DrainerOptions configure a Drainer.
type DrainerOptions struct {
	// MaxRecords caps the records per insert; defaulted to 100 (40,000
	// rows of 400-event webhook batches, about 20 MB of records).
	MaxRecords int
	// Parallel is the number of inserts in flight; defaulted to 2.
	Parallel int
	// Linger is how long a small read waits for more records before it is
	// inserted; defaulted to 1s (negative: no wait). The wait also ends
	// once no record arrived for a quarter of it, so that the end of a
	// burst is stored promptly.
	Linger time.Duration
	// MinBackoff and MaxBackoff bound the wait between failed inserts;
	// defaulted to 200ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// Observe, when set, is called with what each insert did, and with the
	// rows dropped because an insert in flight holds them (as Duplicates);
	// from several goroutines at once.
	Observe func(store.InsertResult)
	// Finish, when set, lets the inserts in flight when Run's ctx is done
	// go on, their checks included, until Finish is done; what they
	// stored is confirmed. Without it they are cancelled with ctx (and
	// their records replay after a restart).
	Finish  context.Context
	Metrics *Metrics
	Logger  *slog.Logger
}

// Drainer drains a Source into ClickHouse: it reads unconfirmed records,
// inserts them, and confirms them only after the insert succeeded. A
// crash between insert and confirm replays the records: their copies are
// rows that every read takes once, so nothing is doubled. The sink drains its spool with one; ingest and tail drain a
// Queue.
type Drainer struct {
	src   Source
	store Inserter
	o     DrainerOptions

	rowsPerRecord int // of the last read, to size the next set (Run only)
}

// NewDrainer makes a drainer; call Run.
func NewDrainer(src Source, st Inserter, o DrainerOptions) *Drainer {
	if o.MaxRecords <= 0 {
		o.MaxRecords = 100
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Parallel <= 0 {
		o.Parallel = 2
	}
	if o.Linger == 0 {
		o.Linger = time.Second
	}
	return &Drainer{src: src, store: st, o: o}
}

// Run drains until ctx is done, the spool is closed, or a Queue is closed
// and empty (then every record is inserted and confirmed before Run
// returns). Insert errors are retried with backoff forever: the spool
// keeps accepting (up to its size), and a queue holds its readers, while
// ClickHouse is away.
//
// Up to Parallel inserts run at once, so that the driver encoding one batch
// overlaps with the server storing the previous one. Positions are
// confirmed strictly in order. Two inserts in flight may hold the same
// event (a redelivery): the copies are rows every read takes once.
func (w *Drainer) Run(ctx context.Context) error {
	type job struct {
		end  spool.Position
		done chan struct{}
		err  error
	}
	var pending []*job // in source order
	inserts := ctx
	if w.o.Finish != nil {
		var cancel context.CancelFunc
		inserts, cancel = context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		defer context.AfterFunc(w.o.Finish, cancel)()
	}
	// confirm confirms the finished prefix of pending. The spool
	// serialises Next and Confirm, so both happen on this goroutine.
	confirm := func() error {
		for len(pending) > 0 {
			select {
			case <-pending[0].done:
			default:
				return nil
			}
			if j := pending[0]; j.err != nil {
				return j.err
			} else if err := w.src.Confirm(j.end); err != nil {
				return fmt.Errorf("confirm: %w", err)
			}
			pending = pending[1:]
		}
		return nil
	}
	stop := func(err error) error {
		for _, j := range pending {
			<-j.done // inserts end promptly once ctx (or Finish) is done
		}
		if ctx.Err() != nil {
			_ = confirm() // what the inserts stored; the rest replays after a restart
			return nil    //nolint:nilerr // a shutdown, not a failure
		}
		return err
	}
	for {
		w.gauge()
		if err := confirm(); err != nil {
			return stop(err)
		}
		if len(pending) >= w.o.Parallel {
			select {
			case <-pending[0].done:
			case <-ctx.Done():
				return stop(nil)
			}
			continue
		}
		next, cancel := ctx, context.CancelFunc(func() {})
		if len(pending) > 0 {
			// Come back soon to confirm what finishes meanwhile.
			next, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
		}
		b, err := w.src.Next(next, w.o.MaxRecords)
		cancel()
		if err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, spool.ErrClosed):
				return stop(nil)
			case errors.Is(err, io.EOF):
				for _, j := range pending {
					<-j.done
				}
				return stop(confirm())
			case errors.Is(err, context.DeadlineExceeded):
				continue
			}
			return stop(fmt.Errorf("read records: %w", err))
		}
		b = w.linger(ctx, b)
		set := record.NewSet(len(b.Records) * w.rowsPerRecord * 9 / 8)
		for _, rec := range b.Records {
			// The records belong to us and are never changed: parse
			// without copying.
			if err := set.Add(unsafe.String(unsafe.SliceData(rec), len(rec))); err != nil {
				// The spool's checksum matched, so this is a record from a
				// newer or broken sink: keep it visible, do not block.
				w.o.Logger.Error("undecodable spool record; dead-lettering it", "err", err)
				set.AddDead(audit.DeadLetter{Source: "spool", Reason: err.Error(), Raw: string(audit.Sample(rec)), ReceivedAt: time.Now().UnixMicro()})
			}
		}
		if len(b.Records) > 0 {
			w.rowsPerRecord = set.Rows() / len(b.Records)
		}
		j := &job{end: b.End, done: make(chan struct{})}
		pending = append(pending, j)
		go func() {
			defer close(j.done)
			j.err = w.insert(inserts, set)
		}()
	}
}

// linger gathers more records for up to Linger when b is small, so that a
// trickle of small webhook batches becomes fewer, larger inserts (each
// insert costs ClickHouse a part, and CPU the HTTP side needs). It stops
// early once no record arrived for Linger/4: the trickle has paused.
func (w *Drainer) linger(ctx context.Context, b spool.Batch) spool.Batch {
	deadline := time.Now().Add(w.o.Linger)
	for len(b.Records) < w.o.MaxRecords && w.o.Linger > 0 {
		until := time.Now().Add(w.o.Linger / 4)
		if deadline.Before(until) {
			until = deadline
		}
		wait, cancel := context.WithDeadline(ctx, until)
		more, err := w.src.Next(wait, w.o.MaxRecords-len(b.Records))
		cancel()
		if err != nil {
			return b // the deadline, or a closing source: insert what we have
		}
		b.Records = append(b.Records, more.Records...)
		b.End = more.End
	}
	return b
}

func (w *Drainer) insert(ctx context.Context, set *record.Set) error {
	b := Backoff{Min: w.o.MinBackoff, Max: w.o.MaxBackoff}
	log := w.o.Logger.With("rows", set.Rows())
	return Retry(ctx, b, log, "ClickHouse insert", func(err error) {
		w.o.Metrics.CountCHError(OpInsert, err)
		w.gauge()
	}, func() error {
		start := time.Now()
		res, err := w.store.InsertRecords(ctx, set)
		if err != nil {
			return err
		}
		if m := w.o.Metrics; m != nil {
			m.FlushSeconds.Observe(time.Since(start).Seconds())
			m.Stored.Add(float64(res.Stored))
			m.Deduplicated.Add(float64(res.Duplicates))
		}
		if w.o.Observe != nil {
			w.o.Observe(res)
		}
		return nil
	})
}

// gauge sets the spool size metric when the source is a spool.
func (w *Drainer) gauge() {
	sp, ok := w.src.(*spool.Spool)
	if ok && w.o.Metrics != nil {
		w.o.Metrics.SpoolBytes.Set(float64(sp.Stats().BytesOnDisk))
	}
}
