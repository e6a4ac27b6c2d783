package pipeline

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

	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/logfile"
)

// The log file itself is the durable buffer for `ingest` and `tail`, so
// they need no spool: their records go through a bounded in-memory Queue
// into the same Drainer as the sink's spool (gathered inserts, several in
// flight, confirmed in order). An interrupted ingest is simply run again:
// what it stores again is a copy that every read takes once; tail's
// checkpoint moves only past what ClickHouse confirmed.

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
	r, err := logfile.NewReader(f, logfile.ReaderOptions{})
	if err != nil {
		return err
	}
	defer r.Close()
	items := &lineItems{r: r, n: n}
	ar, err := o.Accepter.Accept(o.Cluster, "file", items, func(rec []byte) error {
		return q.Append(ctx, bytes.Clone(rec), nil)
	})
	n.accepted.Add(int64(ar.Accepted))
	n.rejected.Add(int64(ar.Rejected))
	n.skipped.Add(int64(ar.Skipped))
	return err
}

// lineItems adapts logfile lines to an ItemReader, and counts the lines
// and bytes read for the progress line.
type lineItems struct {
	r    *logfile.Reader
	n    *ingestCounts
	read int64 // of r.BytesRead(), already in n.bytes
}

func (l *lineItems) Next() (audit.Item, error) {
	line, err := l.r.Next()
	if b := l.r.BytesRead(); b != l.read {
		l.n.bytes.Add(b - l.read)
		l.read = b
	}
	if err == nil {
		l.n.events.Add(1)
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

// progress draws ingest's progress line on w about every 200ms, until the
// returned stop is called (which draws it a last time).
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
