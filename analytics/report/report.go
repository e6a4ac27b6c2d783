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
	// Top bounds every list. Defaults to DefaultTop (10).
	Top int
	// Namespace, Resource and User narrow the report; empty means all.
	Namespace, Resource, User string
	// LoopGap is the longest pause inside a retry loop. Defaults to
	// DefaultLoopGap (5m).
	LoopGap time.Duration
	// LoopThreshold is the fewest conflicts that make a retry loop.
	// Defaults to DefaultLoopThreshold (5).
	LoopThreshold int
	// NoRollup computes every count from the raw events table, for
	// verification and benchmarks. By default the whole hours of the
	// window come from request_rollup and only the partial hours at its
	// edges from events; both give the same numbers.
	NoRollup bool

	// plan is where the counts come from: request_rollup's hours and the
	// raw edges around them.
	plan readPlan
	// parallel is how many queries run at once (reportParallelism).
	parallel int
	// rawLoops computes retry loops from events instead of the loop tables.
	rawLoops bool
	// noDuplicates says that no event of the window is recorded as stored
	// more than once, so the queries skip the correction.
	noDuplicates bool
	// keyedByInstant says that the correction may match events to their
	// duplicates by instant and fingerprint (asql.Report.KeyedByInstant).
	keyedByInstant bool
}

// The defaults of Options (and of `auditsink report`'s flags).
const (
	// DefaultTop is Options.Top's default.
	DefaultTop = 10
	// DefaultLoopGap is Options.LoopGap's default.
	DefaultLoopGap = 5 * time.Minute
	// DefaultLoopThreshold is Options.LoopThreshold's default.
	DefaultLoopThreshold = 5
)

func (o *Options) setDefaults() {
	if o.parallel <= 0 {
		o.parallel = reportParallelism
	}
	if o.Top <= 0 {
		o.Top = DefaultTop
	}
	if o.LoopGap <= 0 {
		o.LoopGap = DefaultLoopGap
	}
	if o.LoopThreshold <= 0 {
		o.LoopThreshold = DefaultLoopThreshold
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
	// Where no event the report reads (the window, and any hour read
	// whole around it) is recorded as stored more than once, the
	// correction changes no figure: skip it (the common case).
	var doubled uint64
	from, until := o.plan.covered(o.Since, o.Until)
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+o.Database+".duplicate_events WHERE cluster = ? AND "+
		"event_date >= toDate(toDateTime(intDiv(?, 1000000))) AND event_date <= toDate(toDateTime(intDiv(?, 1000000))) AND "+
		"event_time_us >= ? AND event_time_us < ?", o.Cluster, uint64(from.UnixMicro()), uint64(until.UnixMicro()),
		uint64(from.UnixMicro()), uint64(until.UnixMicro())).Scan(&doubled); err != nil {
		return nil, fmt.Errorf("read duplicates: %w", err)
	}
	o.noDuplicates = doubled == 0
	q := o.querier(ctx, conn)
	if !o.noDuplicates {
		// The correction may match events to their duplicates by instant
		// and fingerprint, cheaper to read than the identity, unless an
		// event the report reads so shares those with a duplicate it is
		// not.
		if check := q.binder.InstantKeyCollisions(All...); check != "" {
			var collisions uint64
			if err := conn.QueryRow(ctx, check, q.args...).Scan(&collisions); err != nil {
				return nil, fmt.Errorf("read duplicates: %w", err)
			}
			o.keyedByInstant = collisions == 0
			q = o.querier(ctx, conn)
		}
	}

	t := &r.Totals
	r.ConflictsByUser, r.ConflictsByResource, r.HotObjects = []UserConflicts{}, []ResourceConflicts{}, []HotObject{}
	r.RetryLoops, r.StamplessUpdates, r.LeaseHolderChanges, r.PolicyDecisions = []RetryLoop{}, []StamplessUpdates{}, []LeaseChanges{}, []PolicyDecisions{}
	err := q.parallel(o.parallel,
		run{QueryTotals, t.scan},
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
		o.plan = rawPlan(o.Since, o.Until)
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
	o.plan = planRead(o.Since, o.Until, rollupComplete, time.Now().Add(-openHourMargin))
	o.rawLoops = o.Since.Before(loopsComplete)
	return nil
}

// openHourMargin is how long after its end an hour counts as closed: the
// report reads an hour that cuts the window whole from request_rollup,
// minus its events outside the window, only once the hour is closed, so
// that an event stored while the query runs cannot land in one of the two
// reads and not the other. Later events (a backfill, a spool draining
// after an outage) are counted as of when each table is read.
const openHourMargin = 10 * time.Minute

// readPlan is where the counts of a window [since, until) come from:
// request_rollup's hours [from, to) (none when both are zero) and two raw
// edges of events around them. An edge either adds the part of the window
// outside the hours (sign +1) or, where an hour that cuts the window is
// read whole, subtracts that hour's part outside the window (sign -1). The
// edges never overlap, and edge1 lies before edge2.
type readPlan struct {
	from, to     time.Time
	edge1, edge2 edge
}

// planRead plans the read of [since, until): request_rollup's whole hours
// from complete on (when it holds every event), and for each hour that
// cuts the window, whichever raw read is the shorter: the window's part of
// the hour, or the rest of the hour subtracted from the whole hour (only
// for hours from complete on that ended before closed). At most half an
// hour of raw events on each side is read, where reading only the window's
// part could take an hour's worth.
func planRead(since, until, complete, closed time.Time) readPlan {
	since, until = since.UTC(), until.UTC()
	c := ceilHour(complete)
	usable := func(h time.Time) bool { return !h.Before(c) && !h.Add(time.Hour).After(closed) }
	h1, h2 := since.Truncate(time.Hour), until.Truncate(time.Hour)
	if h1.Equal(h2) { // the window lies inside one hour
		if 2*until.Sub(since) > time.Hour && usable(h1) {
			return readPlan{from: h1, to: h1.Add(time.Hour), edge1: span(h1, since, -1), edge2: span(until, h1.Add(time.Hour), -1)}
		}
		return rawPlan(since, until)
	}
	from, to := ceilHour(since), h2
	if from.Before(c) {
		from = c
	}
	if to.Before(from) { // no hour of the window is complete in the rollup
		return rawPlan(since, until)
	}
	p := readPlan{edge1: span(since, from, 1), edge2: span(to, until, 1)}
	if since.After(h1) && from.Equal(h1.Add(time.Hour)) && usable(h1) && since.Sub(h1) < from.Sub(since) {
		from, p.edge1 = h1, span(h1, since, -1)
	}
	if until.After(h2) && usable(h2) && h2.Add(time.Hour).Sub(until) < until.Sub(h2) {
		to, p.edge2 = h2.Add(time.Hour), span(until, h2.Add(time.Hour), -1)
	}
	if from.Before(to) {
		p.from, p.to = from, to
	}
	return p
}

// rawPlan reads all of [since, until) from events.
func rawPlan(since, until time.Time) readPlan {
	return readPlan{edge1: span(since, until, 1), edge2: noEdge}
}

// ceilHour is t rounded up to a whole UTC hour.
func ceilHour(t time.Time) time.Time {
	h := t.UTC().Truncate(time.Hour)
	if h.Before(t) {
		h = h.Add(time.Hour)
	}
	return h
}

// span is the edge [from, to) as a closed range, with its sign.
func span(from, to time.Time, sign int64) edge {
	if !from.Before(to) {
		return noEdge
	}
	return edge{uint64(from.UnixMicro()), uint64(to.UnixMicro()) - 1, sign}
}

// edge is a closed range of microseconds [from, last] (from > last when
// empty) and whether its events add to the counts (+1) or subtract (-1).
type edge struct {
	from, last uint64
	sign       int64
}

// noEdge is empty, and its day range (1970-01-03 to 1970-01-01) is empty
// too, so that ClickHouse prunes every partition.
var noEdge = edge{from: 2 * 86_400_000_000, last: 0, sign: 1}

// covered is the span the plan reads: the window and any hour read whole
// around it.
func (p readPlan) covered(since, until time.Time) (time.Time, time.Time) {
	if !p.from.IsZero() && p.from.Before(since) {
		since = p.from
	}
	if p.to.After(until) {
		until = p.to
	}
	return since, until
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
	e1, e2 := o.plan.edge1, o.plan.edge2
	return []any{
		clickhouse.Named(asql.ReportRollupFromUs, micros(o.plan.from)),
		clickhouse.Named(asql.ReportRollupToUs, micros(o.plan.to)),
		clickhouse.Named(asql.ReportEdge1FromUs, e1.from), clickhouse.Named(asql.ReportEdge1LastUs, e1.last), clickhouse.Named(asql.ReportEdge1Sign, e1.sign),
		clickhouse.Named(asql.ReportEdge2FromUs, e2.from), clickhouse.Named(asql.ReportEdge2LastUs, e2.last), clickhouse.Named(asql.ReportEdge2Sign, e2.sign),
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
		binder: asql.Report{Database: o.Database, RawLoops: o.rawLoops, NoDuplicates: o.noDuplicates, KeyedByInstant: o.keyedByInstant}}
}

// scan reads a row of QueryTotals into t.
func (t *Totals) scan(rows driver.Rows) error {
	return rows.Scan(&t.Requests, &t.WriteAttempts, &t.VersionConflicts, &t.FieldConflicts, &t.AlreadyExists,
		&t.DeletePreconditionConflicts, &t.StamplessUpdates, &t.OtherConflicts, &t.Gone, &t.ConflictRate)
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
