package analytics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/stampguard/stampguard/analytics/logfile"
)

// The log file itself is the durable buffer for `ingest` and `tail`, so
// they insert straight into the store (no spool): an interrupted ingest is
// simply run again, and the store's dedup drops what was already stored.

// IngestOptions configure IngestFiles.
type IngestOptions struct {
	Cluster  string
	Accepter *Accepter
	// Progress, when set, receives a progress line (\r-updated) about
	// every 200ms; give it the terminal.
	Progress io.Writer
	Logger   *slog.Logger
}

// IngestResult sums up an ingest.
type IngestResult struct {
	Files      int
	Accepted   int // events decoded and kept
	Stored     int // rows inserted
	Duplicates int // rows already stored (a repeated ingest stores none)
	Rejected   int // dead letters
	Skipped    int // events of stages not stored
	Elapsed    time.Duration
}

// String is the summary line.
func (r IngestResult) String() string {
	rate := 0.0
	if r.Elapsed > 0 {
		rate = float64(r.Accepted+r.Skipped+r.Rejected) / r.Elapsed.Seconds()
	}
	return fmt.Sprintf("%d files: %d events stored, %d already stored, %d dead-lettered, %d skipped (stage) in %s (%.0f events/s)",
		r.Files, r.Stored, r.Duplicates, r.Rejected, r.Skipped, r.Elapsed.Round(time.Millisecond), rate)
}

// IngestFiles stores the events of JSON-lines audit logs (plain or gzip).
func IngestFiles(ctx context.Context, st Inserter, paths []string, o IngestOptions) (IngestResult, error) {
	if o.Accepter == nil {
		o.Accepter = &Accepter{}
	}
	start := time.Now()
	var res IngestResult
	var total int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return res, err
		}
		total += fi.Size()
	}
	var done atomic.Int64
	stopProgress := progress(o.Progress, total, &done, &res)
	defer stopProgress()
	for _, p := range paths {
		if err := ingestFile(ctx, st, p, o, &res, &done); err != nil {
			return res, fmt.Errorf("ingest %s: %w", p, err)
		}
		res.Files++
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

func ingestFile(ctx context.Context, st Inserter, path string, o IngestOptions, res *IngestResult, done *atomic.Int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := logfile.NewReader(&countingReader{r: f, n: done}, logfile.ReaderOptions{})
	if err != nil {
		return err
	}
	defer r.Close()
	ar, err := o.Accepter.Accept(o.Cluster, "file", &lineItems{next: r.Next}, func(rec []byte) error {
		return insertRecord(ctx, st, rec, res, o.Logger)
	})
	res.Accepted += ar.Accepted
	res.Rejected += ar.Rejected
	res.Skipped += ar.Skipped
	return err
}

// insertRecord inserts an encoded batch, retrying while ClickHouse is away
// (until ctx ends).
func insertRecord(ctx context.Context, st Inserter, rec []byte, res *IngestResult, log *slog.Logger) error {
	var set RecordSet
	if err := set.Add(string(rec)); err != nil {
		return err
	}
	backoff := 200 * time.Millisecond
	for {
		ir, err := st.InsertRecords(ctx, &set)
		if err == nil {
			res.Stored += ir.Stored
			res.Duplicates += ir.Duplicates
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if log != nil {
			log.Warn("ClickHouse insert failed; retrying", "err", err, "retryIn", backoff)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// lineItems adapts logfile lines to an ItemReader.
type lineItems struct {
	next func() (logfile.Line, error)
}

func (l *lineItems) Next() (Item, error) {
	line, err := l.next()
	var tooLong *logfile.LineTooLongError
	switch {
	case errors.As(err, &tooLong):
		return Item{Err: err}, nil
	case err != nil:
		return Item{}, err
	}
	return Item{Raw: line.Data}, nil
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

func progress(w io.Writer, total int64, done *atomic.Int64, res *IngestResult) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	draw := func() {
		d := done.Load()
		pct := 100.0
		if total > 0 {
			pct = 100 * float64(d) / float64(total)
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
		mb := float64(d) / (1 << 20)
		fmt.Fprintf(w, "\r[%s] %5.1f%%  %.1f MiB  %.1f MiB/s ", bar, pct, mb, mb/time.Since(start).Seconds())
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
// are inserted in batches, and the checkpoint is confirmed only after the
// insert, so a restart resumes with nothing lost; lines inserted but not
// yet confirmed before a crash are read again and dropped by the store's
// dedup.
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
	var (
		items       []Item
		last        logfile.Checkpoint
		res         IngestResult
		lostCounted int64 // f.LostBytes() already in the metric
	)
	flush := func() error {
		if len(items) == 0 {
			return nil
		}
		before := res
		accepted, err := o.Accepter.Accept(o.Cluster, "tail", &sliceItems{items: items}, func(rec []byte) error {
			return insertRecord(ctx, st, rec, &res, o.Logger)
		})
		if err != nil {
			return err
		}
		if m := o.Metrics; m != nil {
			m.CountAccepted("tail", accepted)
			m.Stored.Add(float64(res.Stored - before.Stored))
			m.Deduplicated.Add(float64(res.Duplicates - before.Duplicates))
			if lost := f.LostBytes(); lost > lostCounted {
				m.TailLostBytes.Add(float64(lost - lostCounted))
				lostCounted = lost
			}
		}
		if last != (logfile.Checkpoint{}) {
			if err := f.Confirm(last); err != nil {
				return fmt.Errorf("confirm checkpoint: %w", err)
			}
		}
		items = items[:0]
		return nil
	}
	deadline := time.Now().Add(o.FlushInterval)
	for {
		wait, cancel := context.WithDeadline(ctx, deadline)
		line, err := f.Next(wait)
		cancel()
		var tooLong *logfile.LineTooLongError
		switch {
		case err == nil:
			items = append(items, Item{Raw: line.Data})
			last = line.Checkpoint
		case errors.As(err, &tooLong):
			items = append(items, Item{Err: err})
		case ctx.Err() != nil:
			return nil // unconfirmed lines are read again after a restart
		case errors.Is(err, context.DeadlineExceeded):
		default:
			return fmt.Errorf("follow %s: %w", path, err)
		}
		if len(items) >= o.BatchLines || !time.Now().Before(deadline) {
			if err := flush(); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			deadline = time.Now().Add(o.FlushInterval)
		}
	}
}

type sliceItems struct {
	items []Item
	i     int
}

func (s *sliceItems) Next() (Item, error) {
	if s.i >= len(s.items) {
		return Item{}, io.EOF
	}
	s.i++
	return s.items[s.i-1], nil
}
