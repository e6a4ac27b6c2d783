package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/logfile"
)

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
// again, and their copies count once in every read.
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
