package analytics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/analytics/logfile"
	"github.com/stampguard/stampguard/analytics/store"
)

// The log file itself is the durable buffer for `ingest` and `tail`, so
// they need no spool: their records go through a bounded in-memory Queue
// into the same Drainer as the sink's spool (gathered inserts, several in
// flight, confirmed in order). An interrupted ingest is simply run again,
// and the store's dedup drops what was already stored; tail's checkpoint
// moves only past what ClickHouse confirmed.

// IngestOptions configure IngestFiles.
type IngestOptions struct {
	Cluster  string
	Accepter *Accepter
	// Progress, when set, receives a progress line (\r-updated) about
	// every 200ms; give it the terminal.
	Progress io.Writer
	// Decoders is how many files are decoded at once; defaulted to
	// GOMAXPROCS.
	Decoders int
	// Parallel is the number of inserts in flight; defaulted to 2.
	Parallel int
	Logger   *slog.Logger
}

// IngestResult sums up an ingest.
type IngestResult struct {
	Files      int
	Accepted   int // events decoded and kept
	Stored     int // rows inserted
	Duplicates int // rows repeated within a batch, sent once
	Rejected   int // dead letters
	Skipped    int // events of stages not stored
	Elapsed    time.Duration
	// Uncompacted: the hour caches of the stored hours were not rebuilt
	// (the figures are the same, read from events).
	Uncompacted error
}

// String is the summary line.
func (r IngestResult) String() string {
	rate := 0.0
	if r.Elapsed > 0 {
		rate = float64(r.Accepted+r.Skipped+r.Rejected) / r.Elapsed.Seconds()
	}
	line := fmt.Sprintf("%d files: %d events stored (an event stored before counts once), %d repeated in a batch, %d dead-lettered, %d skipped (stage) in %s (%.0f events/s)",
		r.Files, r.Stored, r.Duplicates, r.Rejected, r.Skipped, r.Elapsed.Round(time.Millisecond), rate)
	if r.Uncompacted != nil {
		line += fmt.Sprintf("\nThe hour caches were not rebuilt (%v): the figures are the same, read from events; serve, tail or `auditsink migrate` rebuild them.", r.Uncompacted)
	}
	return line
}

// Compactor builds the hour caches (a Store).
type Compactor interface {
	Compact(ctx context.Context, since time.Time, after time.Duration) (store.CompactResult, error)
}

// File records are the Accepter's (5,000 rows); an insert gathers up to
// ingestMaxRecords of them, as the sink's about 40,000 rows.
const (
	ingestMaxRecords = 8
	// queueBytes bounds the records decoded ahead of the inserts.
	queueBytes = 16 << 20
)

// ingestCounts are an ingest's running totals, shared by the decoders,
// the inserts and the progress line.
type ingestCounts struct {
	bytes, events               atomic.Int64
	accepted, rejected, skipped atomic.Int64
	stored, duplicates          atomic.Int64
}

// IngestFiles stores the events of JSON-lines audit logs (plain or gzip),
// several files decoded at once.
func IngestFiles(ctx context.Context, st Inserter, paths []string, o IngestOptions) (IngestResult, error) {
	if o.Accepter == nil {
		o.Accepter = &Accepter{}
	}
	if o.Decoders <= 0 {
		o.Decoders = runtime.GOMAXPROCS(0)
	}
	start := time.Now()
	var total int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return IngestResult{}, err
		}
		total += fi.Size()
	}
	var n ingestCounts
	stopProgress := progress(o.Progress, total, &n)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := NewQueue(queueBytes, nil)
	d := NewDrainer(q, st, DrainerOptions{MaxRecords: ingestMaxRecords, Parallel: o.Parallel, Logger: o.Logger,
		Observe: func(r store.InsertResult) {
			n.stored.Add(int64(r.Stored))
			n.duplicates.Add(int64(r.Duplicates))
		}})
	drained := make(chan error, 1)
	go func() { drained <- d.Run(ctx) }()

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		files int
	)
	sem := make(chan struct{}, o.Decoders)
	for _, p := range paths {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := ingestFile(ctx, q, p, o, &n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = fmt.Errorf("ingest %s: %w", p, err)
				cancel()
			}
			if err == nil {
				files++
			}
		})
	}
	wg.Wait()
	q.Close()
	err := <-drained
	stopProgress()
	if first != nil {
		err = first
	} else if err == nil {
		err = ctx.Err()
	}
	res := IngestResult{
		Files: files, Accepted: int(n.accepted.Load()), Rejected: int(n.rejected.Load()), Skipped: int(n.skipped.Load()),
		Stored: int(n.stored.Load()), Duplicates: int(n.duplicates.Load()), Elapsed: time.Since(start),
	}
	if c, ok := st.(Compactor); ok && err == nil {
		// The hours this ingest closed: a report right after it reads them
		// from their caches. All days, for a backfill.
		if _, cerr := c.Compact(ctx, time.Unix(0, 0), store.DefaultCompactAfter); cerr != nil {
			res.Uncompacted = cerr
		}
	}
	return res, err
}

func ingestFile(ctx context.Context, q *Queue, path string, o IngestOptions, n *ingestCounts) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := logfile.NewReader(&countingReader{r: f, n: &n.bytes}, logfile.ReaderOptions{})
	if err != nil {
		return err
	}
	defer r.Close()
	items := &lineItems{next: r.Next, n: &n.events}
	ar, err := o.Accepter.Accept(o.Cluster, "file", items, func(rec []byte) error {
		return q.Append(ctx, bytes.Clone(rec), nil)
	})
	n.accepted.Add(int64(ar.Accepted))
	n.rejected.Add(int64(ar.Rejected))
	n.skipped.Add(int64(ar.Skipped))
	return err
}

// lineItems adapts logfile lines to an ItemReader.
type lineItems struct {
	next func() (logfile.Line, error)
	n    *atomic.Int64 // lines read, for the progress line (may be nil)
}

func (l *lineItems) Next() (audit.Item, error) {
	line, err := l.next()
	if err == nil && l.n != nil {
		l.n.Add(1)
	}
	var tooLong *logfile.LineTooLongError
	switch {
	case errors.As(err, &tooLong):
		return audit.Item{Err: err}, nil
	case err != nil:
		return audit.Item{}, err
	}
	return audit.Item{Raw: line.Data}, nil
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func progress(w io.Writer, total int64, n *ingestCounts) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	draw := func() {
		d := n.bytes.Load()
		pct := 100.0
		if total > 0 {
			pct = min(100, 100*float64(d)/float64(total))
		}
		const width = 30
		filled := int(pct / 100 * width)
		bar := make([]byte, width)
		for i := range bar {
			bar[i] = ' '
			if i < filled {
				bar[i] = '='
			}
		}
		secs := time.Since(start).Seconds()
		eta := "--"
		if d > 0 && total > d {
			eta = (time.Duration(float64(total-d) / float64(d) * secs * float64(time.Second))).Round(time.Second).String()
		}
		fmt.Fprintf(w, "\r[%s] %5.1f%%  %.1f MiB  %.0f events/s  ETA %s ", bar, pct, float64(d)/(1<<20), float64(n.events.Load())/secs, eta)
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				draw()
				fmt.Fprintln(w)
				return
			case <-t.C:
				draw()
			}
		}
	}()
	return func() { close(stop); <-finished }
}

// TailOptions configure Tail.
type TailOptions struct {
	Cluster  string
	Accepter *Accepter
	// CheckpointPath keeps the confirmed position across restarts. Required.
	CheckpointPath string
	// BatchLines caps the lines per insert; defaulted to 5000.
	BatchLines int
	// FlushInterval is the longest a read line waits for its insert;
	// defaulted to 1s.
	FlushInterval time.Duration
	// PollInterval is how often the file is polled; defaulted by logfile.
	PollInterval time.Duration
	Metrics      *Metrics
	Logger       *slog.Logger
}

// Tail follows a live audit log across rotations until ctx is done. Lines
// are accepted in groups (BatchLines, or what FlushInterval gathered) and
// stored by a Drainer; the checkpoint of a group is confirmed only once
// ClickHouse stored it and everything before it, so a restart resumes with
// nothing lost; lines stored but not yet confirmed before a crash are read
// again and dropped by the store's dedup.
func Tail(ctx context.Context, st Inserter, path string, o TailOptions) error {
	if o.Accepter == nil {
		o.Accepter = &Accepter{}
	}
	if o.BatchLines <= 0 {
		o.BatchLines = 5000
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	f, err := logfile.Follow(ctx, path, logfile.FollowOptions{CheckpointPath: o.CheckpointPath,
		PollInterval: o.PollInterval, Logger: o.Logger})
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := NewQueue(queueBytes, func(mark any) error { return f.Confirm(mark.(logfile.Checkpoint)) })
	d := NewDrainer(q, st, DrainerOptions{MaxRecords: ingestMaxRecords, Linger: o.FlushInterval / 4,
		Metrics: o.Metrics, Logger: o.Logger})
	drained := make(chan error, 1)
	go func() { drained <- d.Run(ctx) }()
	if c, ok := st.(Compactor); ok {
		go CompactEvery(ctx, c, DefaultCompactEvery, o.Metrics, o.Logger)
	}
	stop := func(err error) error {
		cancel() // unconfirmed lines are read again after a restart
		if derr := <-drained; err == nil {
			err = derr
		}
		return err
	}
	var (
		items       []audit.Item
		last        logfile.Checkpoint
		lostCounted int64 // f.LostBytes() already in the metric
	)
	// flush accepts the group; its last record carries the group's
	// checkpoint.
	flush := func() error {
		if len(items) == 0 {
			return nil
		}
		var prev []byte
		accepted, err := o.Accepter.Accept(o.Cluster, "tail", &sliceItems{items: items}, func(rec []byte) error {
			if prev != nil {
				if err := q.Append(ctx, prev, nil); err != nil {
					return err
				}
			}
			prev = bytes.Clone(rec)
			return nil
		})
		if err == nil && prev != nil {
			var mark any
			if last != (logfile.Checkpoint{}) {
				mark = last
			}
			err = q.Append(ctx, prev, mark)
		}
		items = items[:0]
		if m := o.Metrics; m != nil {
			m.CountAccepted("tail", accepted)
			if lost := f.LostBytes(); lost > lostCounted {
				m.TailLostBytes.Add(float64(lost - lostCounted))
				lostCounted = lost
			}
		}
		return err
	}
	deadline := time.Now().Add(o.FlushInterval)
	for {
		wait, cancelWait := context.WithDeadline(ctx, deadline)
		line, err := f.Next(wait)
		cancelWait()
		var tooLong *logfile.LineTooLongError
		switch {
		case err == nil:
			items = append(items, audit.Item{Raw: line.Data}) // Data belongs to us
			last = line.Checkpoint
		case errors.As(err, &tooLong):
			items = append(items, audit.Item{Err: err})
		case ctx.Err() != nil:
			return stop(nil)
		case errors.Is(err, context.DeadlineExceeded):
		default:
			return stop(fmt.Errorf("follow %s: %w", path, err))
		}
		if len(items) >= o.BatchLines || !time.Now().Before(deadline) {
			if err := flush(); err != nil {
				if ctx.Err() != nil {
					return stop(nil)
				}
				return stop(err)
			}
			deadline = time.Now().Add(o.FlushInterval)
		}
		select {
		case err := <-drained:
			// The drainer stopped on its own: a confirm failed.
			drained <- err
			return stop(nil)
		default:
		}
	}
}

type sliceItems struct {
	items []audit.Item
	i     int
}

func (s *sliceItems) Next() (audit.Item, error) {
	if s.i >= len(s.items) {
		return audit.Item{}, io.EOF
	}
	s.i++
	return s.items[s.i-1], nil
}

// DefaultCompactEvery is how often serve and tail look for hours to
// compact.
const DefaultCompactEvery = time.Minute

// CompactDays is how far back the periodic compaction looks: a backfill
// of older hours is compacted by the ingest that stored it (or by
// `auditsink migrate`), and read from events until then.
const CompactDays = 7

// CompactEvery compacts the hours of the last CompactDays days that need
// it now and then every interval, until ctx is done. A failure is logged
// and retried at the next interval: the caches are an optimisation, and
// an hour without one is read from events.
func CompactEvery(ctx context.Context, c Compactor, every time.Duration, m *Metrics, log *slog.Logger) {
	for {
		if _, err := c.Compact(ctx, time.Now().AddDate(0, 0, -CompactDays), store.DefaultCompactAfter); err != nil && ctx.Err() == nil {
			m.CountCHError(OpCompact, err)
			log.Warn("compaction of the hour caches failed; those hours are read from events meanwhile", "err", err, "retryIn", every.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
