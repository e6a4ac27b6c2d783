package pipeline

import (
	"context"
	"log/slog"
	"time"
)

// Backoff bounds the waits between the attempts of retry.
type Backoff struct {
	// Min is the first wait; defaulted to 200ms. Each failure doubles it.
	Min time.Duration
	// Max caps the wait; defaulted to 10s.
	Max time.Duration
}

// Retry calls fn until it succeeds or ctx ends, waiting b between failed
// attempts, and logs each failure (what names the attempt) with the wait.
// failed, when set, is called with each error before the wait. It returns
// nil or ctx's error: the one retry-while-ClickHouse-is-away loop of the
// sink, ingest and tail.
func Retry(ctx context.Context, b Backoff, log *slog.Logger, what string, failed func(error), fn func() error) error {
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
