package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
)

// Accepter turns a stream of raw events into records (package record): it
// decodes each item, keeps the configured stages, and turns the rest into
// dead letters. It holds no state between calls and is safe for concurrent
// use.
type Accepter struct {
	Decoder audit.Decoder
	// Stages are the stages stored; defaulted to DefaultStages if empty.
	Stages []string
	// RecordRows caps the rows per record; defaulted to 5000.
	RecordRows int
	// RecordBytes starts a new record once one is this large; defaulted to
	// 16 MiB (large raw events must not make a record the spool refuses).
	RecordBytes int
}

// AcceptResult counts what Accept saw.
type AcceptResult struct {
	Accepted int // rows encoded
	Rejected int // dead letters
	Skipped  int // events of stages not stored
}

// Accept reads items until io.EOF and hands each finished record to emit
// (which must copy or persist it before returning). source names the input
// in dead letters and metrics. A read error of the stream is returned as
// is; records already emitted stay emitted (redelivery deduplicates them).
func (a *Accepter) Accept(cluster, source string, items audit.ItemReader, emit func(rec []byte) error) (AcceptResult, error) {
	return a.AcceptTally(cluster, source, items, nil, emit)
}

// AcceptTally is Accept that also counts each row it stores into tally
// (when not nil), as the row is decoded: the sink's live conflict
// signals, which its caller commits once the batch is acknowledged.
func (a *Accepter) AcceptTally(cluster, source string, items audit.ItemReader, tally *Tally, emit func(rec []byte) error) (AcceptResult, error) {
	var res AcceptResult
	maxRows, maxBytes := a.RecordRows, a.RecordBytes
	if maxRows <= 0 {
		maxRows = 5000
	}
	if maxBytes <= 0 {
		maxBytes = 16 << 20
	}
	stages := a.Stages
	if len(stages) == 0 {
		stages = audit.DefaultStages
	}
	buf := recPool.Get().(*[]byte)
	defer recPool.Put(buf)
	rec := record.AppendHeader((*buf)[:0], cluster)
	defer func() { *buf = rec[:0] }()
	header := len(rec)
	n := 0
	flush := func() error {
		if len(rec) == header {
			return nil
		}
		err := emit(rec)
		rec, n = rec[:header], 0
		return err
	}
	var row audit.Row
	for {
		// The row points into the reader's buffer only until it is
		// encoded below, before the next call.
		it, err := audit.NextRow(items, &a.Decoder, &row)
		if err != nil {
			if isEOF(err) {
				return res, flush()
			}
			return res, err
		}
		if it.Err == nil {
			if !slices.Contains(stages, row.Stage) {
				res.Skipped++
				continue
			}
			row.Cluster = cluster
			if tally != nil {
				tally.Add(&row)
			}
			rec = record.AppendRow(rec, &row)
			res.Accepted++
			if n++; n >= maxRows || len(rec) >= maxBytes {
				if err := flush(); err != nil {
					return res, err
				}
			}
			continue
		}
		d := audit.DeadLetter{Cluster: cluster, Source: source, Reason: it.Err.Error(),
			Raw: a.deadRaw(it.Raw), ReceivedAt: time.Now().UnixMicro()}
		rec = record.AppendDeadLetter(rec, &d)
		res.Rejected++
		if n++; n >= maxRows || len(rec) >= maxBytes {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
}

var recPool = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}

// deadRaw is what a dead letter keeps of an input it could not decode. An
// event that failed to decode cannot be redacted reliably, so one that
// mentions a redacted resource is withheld entirely.
func (a *Accepter) deadRaw(raw []byte) string {
	raw = audit.Sample(raw)
	for _, r := range append([]string{"secrets"}, a.Decoder.RedactResources...) {
		if bytes.Contains(raw, []byte(`"`+r+`"`)) {
			return "(withheld: the input names " + r + " and could not be redacted)"
		}
	}
	return string(raw)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

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
	// Enough is the size of records at which a read stops waiting for
	// more: it takes what is already there and is inserted. Defaulted to
	// 16 MiB (about 32,000 events of webhook batches, 80 % of a full
	// insert): waiting longer would only delay the end of a burst.
	Enough int
	// Backoff bounds the wait between failed inserts (see Backoff for
	// its defaults).
	Backoff Backoff
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
// rows that every read takes once, so nothing is doubled. The sink
// drains its spool with one; ingest and tail drain a Queue.
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
	if o.Enough <= 0 {
		o.Enough = 16 << 20
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
// early once no record arrived for Linger/4 (the trickle has paused), and
// waits no more once b holds Enough bytes of records: it then takes only
// what the source already has.
func (w *Drainer) linger(ctx context.Context, b spool.Batch) spool.Batch {
	deadline := time.Now().Add(w.o.Linger)
	size := 0
	for _, rec := range b.Records {
		size += len(rec)
	}
	for len(b.Records) < w.o.MaxRecords && w.o.Linger > 0 {
		until := time.Now().Add(w.o.Linger / 4)
		switch {
		case size >= w.o.Enough:
			until = time.Time{} // already done: Next hands over only what is there
		case deadline.Before(until):
			until = deadline
		}
		wait, cancel := context.WithDeadline(ctx, until)
		more, err := w.src.Next(wait, w.o.MaxRecords-len(b.Records))
		cancel()
		if err != nil {
			return b // the deadline, or a closing source: insert what we have
		}
		for _, rec := range more.Records {
			size += len(rec)
		}
		b.Records = append(b.Records, more.Records...)
		b.End = more.End
	}
	return b
}

func (w *Drainer) insert(ctx context.Context, set *record.Set) error {
	log := w.o.Logger.With("rows", set.Rows())
	return retry(ctx, w.o.Backoff, log, "ClickHouse insert", func(err error) {
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

// Backoff bounds the waits between the attempts of retry.
type Backoff struct {
	// Min is the first wait; defaulted to 200ms. Each failure doubles it.
	Min time.Duration
	// Max caps the wait; defaulted to 10s.
	Max time.Duration
}

// retry calls fn until it succeeds or ctx ends, waiting b between failed
// attempts, and logs each failure (what names the attempt) with the wait.
// failed, when set, is called with each error before the wait. It returns
// nil or ctx's error: the one retry-while-ClickHouse-is-away loop of the
// sink, ingest and tail.
func retry(ctx context.Context, b Backoff, log *slog.Logger, what string, failed func(error), fn func() error) error {
	if b.Min <= 0 {
		b.Min = 200 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	wait := b.Min
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if failed != nil {
			failed(err)
		}
		if log != nil {
			log.Warn(what+" failed; retrying", "err", err, "retryIn", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, b.Max)
	}
}
