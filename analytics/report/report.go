package report

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics"
	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Options select what the report covers.
type Options struct {
	// Database holding the events table.
	Database string
	// Cluster whose events are reported.
	Cluster string
	// Since and Until bound the half-open window [Since, Until).
	Since, Until time.Time
	// Top bounds every list. Defaults to 10.
	Top int
	// Namespace, Resource and User narrow the report; empty means all.
	Namespace, Resource, User string
	// LoopGap is the longest pause inside a retry loop. Defaults to 5m.
	LoopGap time.Duration
	// LoopThreshold is the fewest conflicts that make a retry loop. Defaults to 5.
	LoopThreshold int
	// NoRollup computes every count from the raw events table, for
	// verification and benchmarks. By default the whole hours of the
	// window come from request_rollup and only the partial hours at its
	// edges from events; both give the same numbers.
	NoRollup bool

	// rollupFrom and rollupTo are the whole hours [rollupFrom, rollupTo)
	// that request_rollup answers; both zero when it answers nothing.
	rollupFrom, rollupTo time.Time
	// parallel is how many queries run at once (reportParallelism).
	parallel int
	// rawLoops computes retry loops from events instead of the loop tables.
	rawLoops bool
	// noDuplicates says that no event of the window is recorded as stored
	// more than once, so the queries skip the correction.
	noDuplicates bool
}

func (o *Options) setDefaults() {
	if o.parallel <= 0 {
		o.parallel = reportParallelism
	}
	if o.Top <= 0 {
		o.Top = 10
	}
	if o.LoopGap <= 0 {
		o.LoopGap = 5 * time.Minute
	}
	if o.LoopThreshold <= 0 {
		o.LoopThreshold = 5
	}
}

// ErrNoEvents says that the window holds no request at all, so the report
// has no findings to show; Build still returns the (empty) report.
var ErrNoEvents = errors.New("no audit events in the window")

// TimeFormat is how the report writes instants: RFC3339 in UTC with microseconds.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// Build runs every analytics query and assembles the report. It returns
// ErrNoEvents (with the empty report) when the window holds no request.
func Build(ctx context.Context, conn driver.Conn, o Options) (*Report, error) {
	o.setDefaults()
	if !o.Since.Before(o.Until) {
		return nil, fmt.Errorf("empty window: since %s is not before until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	if err := analytics.ValidDatabase(o.Database); err != nil {
		return nil, err
	}
	r := &Report{Window: Window{Since: o.Since.UTC().Format(TimeFormat), Until: o.Until.UTC().Format(TimeFormat)}}
	if err := o.split(ctx, conn); err != nil {
		return nil, err
	}
	// Where no event of the window is recorded as stored more than once,
	// the correction changes no figure: skip it (the common case).
	var doubled uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+o.Database+".duplicate_events WHERE cluster = ? AND "+
		"event_date >= toDate(toDateTime(intDiv(?, 1000000))) AND event_date <= toDate(toDateTime(intDiv(?, 1000000))) AND "+
		"event_time_us >= ? AND event_time_us < ?", o.Cluster, uint64(o.Since.UnixMicro()), uint64(o.Until.UnixMicro()),
		uint64(o.Since.UnixMicro()), uint64(o.Until.UnixMicro())).Scan(&doubled); err != nil {
		return nil, fmt.Errorf("read duplicates: %w", err)
	}
	o.noDuplicates = doubled == 0
	q := o.querier(ctx, conn)

	t := &r.Totals
	r.ConflictsByUser, r.ConflictsByResource, r.HotObjects = []UserConflicts{}, []ResourceConflicts{}, []HotObject{}
	r.RetryLoops, r.StamplessUpdates, r.LeaseHolderChanges, r.PolicyDecisions = []RetryLoop{}, []StamplessUpdates{}, []LeaseChanges{}, []PolicyDecisions{}
	err := q.parallel(o.parallel,
		run{QueryTotals, func(rows driver.Rows) error {
			return rows.Scan(&t.Requests, &t.WriteAttempts, &t.VersionConflicts, &t.FieldConflicts, &t.AlreadyExists,
				&t.DeletePreconditionConflicts, &t.StamplessUpdates, &t.OtherConflicts, &t.Gone, &t.ConflictRate)
		}},
		// The rate columns are for the dashboards; the report's JSON
		// keeps its contract.
		run{QueryConflictsByUser, collect(&r.ConflictsByUser, func(u *UserConflicts) []any {
			return []any{&u.User, &u.WriteAttempts, &u.VersionConflicts, new(float64)}
		})},
		run{QueryConflictsByResource, collect(&r.ConflictsByResource, func(c *ResourceConflicts) []any {
			return []any{&c.APIGroup, &c.Resource, &c.WriteAttempts, &c.VersionConflicts, new(float64)}
		})},
		run{QueryHotObjects, collect(&r.HotObjects, func(h *HotObject) []any {
			return []any{&h.APIGroup, &h.Resource, &h.Namespace, &h.Name, &h.WriteAttempts, &h.DistinctWriters, &h.VersionConflicts, new(float64)}
		})},
		run{QueryRetryLoops, func(rows driver.Rows) error {
			var l RetryLoop
			var first, last uint64
			var resolved uint8
			err := rows.Scan(&l.User, &l.APIGroup, &l.Resource, &l.Namespace, &l.Name, &l.Conflicts, &first, &last, &resolved)
			l.First = time.UnixMicro(int64(first)).UTC().Format(TimeFormat)
			l.Last = time.UnixMicro(int64(last)).UTC().Format(TimeFormat)
			l.Resolved = resolved == 1
			r.RetryLoops = append(r.RetryLoops, l)
			return err
		}},
		run{QueryStamplessUpdates, collect(&r.StamplessUpdates, func(s *StamplessUpdates) []any {
			return []any{&s.User, &s.APIGroup, &s.Resource, &s.Namespace, &s.Name, &s.Count}
		})},
		run{QueryLeaseHolderChanges, collect(&r.LeaseHolderChanges, func(l *LeaseChanges) []any {
			return []any{&l.Namespace, &l.Name, &l.Changes, &l.Holders}
		})},
		run{QueryPolicyDecisions, collect(&r.PolicyDecisions, func(p *PolicyDecisions) []any {
			return []any{&p.Policy, &p.Kind, &p.Action, &p.Count}
		})},
	)
	if err != nil {
		return nil, err
	}
	if t.Requests == 0 {
		return r, ErrNoEvents
	}
	return r, nil
}

// split decides where the window is read from: request_rollup's whole
// hours from its epoch on, and the loop tables when the window begins at
// or after theirs (both unless NoRollup).
func (o *Options) split(ctx context.Context, conn driver.Conn) error {
	o.rawLoops = o.NoRollup
	if o.NoRollup {
		return nil
	}
	var rollupComplete, loopsComplete time.Time
	// A scalar subquery is Nullable on current releases (26.7), plain on
	// 18.16; ifNull makes it DateTime on both, for the same Scan.
	epoch := func(table string) string {
		return "ifNull((SELECT max(complete_from) FROM " + o.Database + "." + table + "), toDateTime(0))"
	}
	if err := conn.QueryRow(ctx, "SELECT "+epoch("request_rollup_epoch")+", "+epoch("loop_epoch")).
		Scan(&rollupComplete, &loopsComplete); err != nil {
		return fmt.Errorf("read rollup epochs: %w", err)
	}
	o.rollupFrom, o.rollupTo = rollupHours(o.Since, o.Until, rollupComplete)
	o.rawLoops = o.Since.Before(loopsComplete)
	return nil
}

// rollupHours are the whole UTC hours inside [since, until) from complete
// on, as [from, to); both zero when there is none.
func rollupHours(since, until, complete time.Time) (from, to time.Time) {
	from = since.UTC().Truncate(time.Hour)
	if from.Before(since) {
		from = from.Add(time.Hour)
	}
	c := complete.UTC().Truncate(time.Hour)
	if c.Before(complete) {
		c = c.Add(time.Hour)
	}
	if from.Before(c) {
		from = c
	}
	to = until.UTC().Truncate(time.Hour)
	if !from.Before(to) {
		return time.Time{}, time.Time{}
	}
	return from, to
}

// edge is a closed range of microseconds [from, last]; from > last when empty.
type edge struct{ from, last uint64 }

// noEdge is empty, and its day range (1970-01-03 to 1970-01-01) is empty
// too, so that ClickHouse prunes every partition.
var noEdge = edge{from: 2 * 86_400_000_000, last: 0}

func span(from, to time.Time) edge {
	if !from.Before(to) {
		return noEdge
	}
	return edge{uint64(from.UnixMicro()), uint64(to.UnixMicro()) - 1}
}

// rawEdges are the parts of [since, until) outside the rollup's hours
// [from, to): the whole window when the rollup answers nothing.
func rawEdges(since, until, from, to time.Time) (edge, edge) {
	if from.IsZero() {
		return span(since, until), noEdge
	}
	return span(since, from), span(to, until)
}

// micros is t in Unix microseconds, 0 for the zero time.
func micros(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMicro())
}

// args binds the options to the queries' parameters.
func (o *Options) args() []any {
	e1, e2 := rawEdges(o.Since, o.Until, o.rollupFrom, o.rollupTo)
	return []any{
		clickhouse.Named(asql.ReportRollupFromUs, micros(o.rollupFrom)),
		clickhouse.Named(asql.ReportRollupToUs, micros(o.rollupTo)),
		clickhouse.Named(asql.ReportEdge1FromUs, e1.from), clickhouse.Named(asql.ReportEdge1LastUs, e1.last),
		clickhouse.Named(asql.ReportEdge2FromUs, e2.from), clickhouse.Named(asql.ReportEdge2LastUs, e2.last),
		clickhouse.Named(asql.ReportSinceUs, uint64(o.Since.UnixMicro())),
		clickhouse.Named(asql.ReportUntilUs, uint64(o.Until.UnixMicro())),
		clickhouse.Named(asql.Cluster.Name, o.Cluster),
		clickhouse.Named(asql.Namespace.Name, o.Namespace),
		clickhouse.Named(asql.Resource.Name, o.Resource),
		clickhouse.Named(asql.User.Name, o.User),
		clickhouse.Named(asql.Name.Name, ""),
		clickhouse.Named(asql.Top.Name, o.Top),
		clickhouse.Named(asql.GapUs.Name, uint64(o.LoopGap.Microseconds())),
		clickhouse.Named(asql.Threshold.Name, o.LoopThreshold),
	}
}

type driverRows = driver.Rows

// reportParallelism is how many queries run at once: each runs on up to
// max_threads cores, but spends part of its time in single-threaded stages
// (merging aggregates, sorting, arrays), which a second query fills.
const reportParallelism = 2

type querier struct {
	ctx    context.Context
	conn   driver.Conn
	binder asql.Report
	args   []any
}

func (o *Options) querier(ctx context.Context, conn driver.Conn) querier {
	return querier{ctx: ctx, conn: conn, args: o.args(),
		binder: asql.Report{Database: o.Database, RawLoops: o.rawLoops, NoDuplicates: o.noDuplicates}}
}

// collect scans each row into a new T, through the column targets that
// fields gives, and appends it to dst.
func collect[T any](dst *[]T, fields func(*T) []any) func(driver.Rows) error {
	return func(rows driver.Rows) error {
		var v T
		if err := rows.Scan(fields(&v)...); err != nil {
			return err
		}
		*dst = append(*dst, v)
		return nil
	}
}

// run is one query of the report with its row handler.
type run struct {
	query Query
	scan  func(driver.Rows) error
}

// parallel runs the queries, at most n at a time, and joins their errors.
// Each handler is called from one goroutine only.
func (q querier) parallel(n int, runs ...run) error {
	errs := make([]error, len(runs))
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, r := range runs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = q.each(r.query, r.scan)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (q querier) each(query Query, scan func(driver.Rows) error) error {
	rows, err := q.conn.Query(q.ctx, q.binder.Bind(query), q.args...)
	if err != nil {
		return fmt.Errorf("query %s: %w", query.Name, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return fmt.Errorf("query %s: scan: %w", query.Name, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("query %s: %w", query.Name, err)
	}
	return nil
}
