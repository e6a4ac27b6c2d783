package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/analytics/store"
)

// every runs fn now and then every interval until ctx is done: the one
// loop of the periodic jobs (compaction, retention).
func every(ctx context.Context, interval time.Duration, fn func()) {
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// DefaultCompactEvery is how often serve and tail look for hours to
// compact.
const DefaultCompactEvery = time.Minute

// compactDays is how far back the periodic compaction looks: a backfill
// of older hours is compacted by the ingest that stored it (or by
// `auditsink migrate`), and read from events until then.
const compactDays = 7

// CompactEvery compacts the hours of the last compactDays days that need
// it now and then every interval, until ctx is done. A failure is logged
// and retried at the next interval: the caches are an optimisation, and
// an hour without one is read from events.
func CompactEvery(ctx context.Context, c Compactor, interval time.Duration, m *Metrics, log *slog.Logger) {
	every(ctx, interval, func() {
		if _, err := c.Compact(ctx, time.Now().AddDate(0, 0, -compactDays), store.DefaultCompactAfter); err != nil && ctx.Err() == nil {
			m.CountCHError(OpCompact, err)
			log.Warn("compaction of the hour caches failed; those hours are read from events meanwhile", "err", err, "retryIn", interval.String())
		}
	})
}

// retainEvery is how often serve drops expired day partitions.
const retainEvery = time.Hour

// retain drops the day partitions older than keep now and then every
// hour, until ctx is done.
func retain(ctx context.Context, st *store.Store, keep time.Duration, m *Metrics, log *slog.Logger) {
	every(ctx, retainEvery, func() {
		dropped, err := st.DropPartitionsBefore(ctx, time.Now().Add(-keep))
		if err != nil && ctx.Err() == nil {
			m.CountCHError(OpRetention, err)
			log.Warn("retention failed", "err", err)
		} else if len(dropped) > 0 {
			log.Info("retention dropped day partitions", "days", dropped)
		}
	})
}

// schemaUntilReady waits until the schema is at this binary's version,
// retrying while ClickHouse is away; the spool keeps accepting meanwhile.
// A current schema is used as it is, without DDL (a ClickHouse user without
// DDL rights suffices); otherwise the migrations are applied, unless
// noMigrate, which waits for `auditsink migrate` instead.
func schemaUntilReady(ctx context.Context, st *store.Store, noMigrate bool, m *Metrics, log *slog.Logger) error {
	what := "schema migration"
	if noMigrate {
		what = "schema check (--no-migrate)"
	}
	return retry(ctx, Backoff{}, log, what, func(err error) {
		m.CountCHError(OpMigrate, err)
	}, func() error {
		current, err := st.SchemaCurrent(ctx)
		switch {
		case current:
			return nil
		case noMigrate && err != nil:
			return fmt.Errorf("cannot read the schema version of database %s (run auditsink migrate): %w", st.Database(), err)
		case noMigrate:
			return fmt.Errorf("database %s is not at this binary's schema version yet: run auditsink migrate", st.Database())
		}
		applied, err := st.Migrate(ctx)
		if err == nil && len(applied) > 0 {
			log.Info("schema migrated", "versions", applied)
		}
		return err
	})
}

// SpoolOptions configure DrainSpool.
type SpoolOptions struct {
	// NoMigrate runs no DDL: wait until the schema is at this binary's
	// version (migrated by `auditsink migrate`). Off, a current schema is
	// still used without DDL, and an older one is migrated.
	NoMigrate bool
	// Retention drops day partitions older than this every hour (0 keeps
	// all).
	Retention time.Duration
	// Parallel is the number of inserts in flight; defaulted by
	// DrainerOptions.
	Parallel int
	// Finish lets the inserts in flight at shutdown go on until it is done
	// (DrainerOptions.Finish).
	Finish context.Context
	// LostUpdates is the periodic count of lost updates (off when its
	// Every is 0, or without Metrics to show it).
	LostUpdates LostUpdateOptions
	Metrics     *Metrics
	Logger      *slog.Logger
}

// DrainSpool is serve's storing side: it waits for the schema (migrating
// it unless NoMigrate), then drains the spool into st with a Drainer and
// compacts the hour caches every DefaultCompactEvery; with Retention it
// also drops expired days every hour, and with LostUpdates it counts the
// lost updates. It runs until ctx is done (nil) or
// the Drainer fails (its error: without a drainer the spool only fills
// up, so the caller stops, and a restart replays the spool).
func DrainSpool(ctx context.Context, sp *spool.Spool, st *store.Store, o SpoolOptions) error {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // first: the periodic jobs end with the drainer
	if o.Retention > 0 {
		wg.Go(func() { retain(ctx, st, o.Retention, o.Metrics, o.Logger) })
	}
	if err := schemaUntilReady(ctx, st, o.NoMigrate, o.Metrics, o.Logger); err != nil {
		return nil //nolint:nilerr // it ends only with ctx: a shutdown
	}
	wg.Go(func() { CompactEvery(ctx, st, DefaultCompactEvery, o.Metrics, o.Logger) })
	if o.LostUpdates.Every > 0 && o.Metrics != nil {
		wg.Go(func() { countLostEvery(ctx, st, o.LostUpdates, o.Metrics, o.Logger) })
	}
	d := NewDrainer(sp, st, DrainerOptions{Metrics: o.Metrics, Parallel: o.Parallel, Finish: o.Finish,
		Logger: o.Logger.With("component", "drainer")})
	if err := d.Run(ctx); err != nil {
		return fmt.Errorf("spool drainer: %w", err)
	}
	return nil
}
