package report

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

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
	// NoRollup computes every figure from the raw events table, for
	// verification and benchmarks. By default the clean whole hours of
	// the window come from the hour caches and the rest from events; both
	// give the same numbers.
	NoRollup bool
	// History also runs the findings on the field history (lost updates,
	// fights, conflict causes, no-op writes). Off by default: they read
	// the window's history raw, which at 10M events a day takes minutes
	// (BENCHMARKS.md); without it their lists are empty.
	History bool
	// FightHandoffs is the fewest handoffs of a field between writers
	// that make a field fight. Defaults to DefaultFightHandoffs (3).
	FightHandoffs int
	// Logger, when set, receives each statement's time at debug level.
	Logger *slog.Logger

	// plan is where the figures come from: the clean hours' caches and
	// the raw rest.
	plan asql.Plan
	// parallel is how many queries run at once (reportParallelism).
	parallel int
	// hoursOnly stitches every clean hour alone, without blocks: the
	// benchmarks' side by side.
	hoursOnly bool
}

// The defaults of Options (and of `auditsink report`'s flags).
const (
	// DefaultTop is Options.Top's default.
	DefaultTop = 10
	// DefaultLoopGap is Options.LoopGap's default.
	DefaultLoopGap = 5 * time.Minute
	// DefaultLoopThreshold is Options.LoopThreshold's default.
	DefaultLoopThreshold = 5
	// DefaultFightHandoffs is Options.FightHandoffs's default: a value
	// set, taken, taken back and taken again.
	DefaultFightHandoffs = 3
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
	if o.FightHandoffs <= 0 {
		o.FightHandoffs = DefaultFightHandoffs
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
	if err := asql.ValidDatabase(o.Database); err != nil {
		return nil, err
	}
	r := &Report{Window: Window{Since: o.Since.UTC().Format(TimeFormat), Until: o.Until.UTC().Format(TimeFormat)}}
	if err := o.split(ctx, conn); err != nil {
		return nil, err
	}
	q := o.querier(ctx, conn)

	t := &r.Totals
	r.ConflictsByUser, r.ConflictsByResource, r.HotObjects = []UserConflicts{}, []ResourceConflicts{}, []HotObject{}
	r.RetryLoops, r.StamplessUpdates, r.LeaseHolderChanges, r.PolicyDecisions = []RetryLoop{}, []StamplessUpdates{}, []LeaseChanges{}, []PolicyDecisions{}
	r.LostUpdates, r.FieldFights, r.ConflictCauses, r.NoopWrites = []LostUpdate{}, []FieldFight{}, []ConflictCause{}, []NoopWrites{}
	r.FieldWriters = []FieldWriter{}
	runs := []run{
		// The rate columns are for the dashboards; the report's JSON
		// keeps its contract.
		{QueryConflictsByUser, collect(&r.ConflictsByUser, func(u *UserConflicts) []any {
			return []any{&u.User, &u.WriteAttempts, &u.VersionConflicts, new(float64)}
		})},
		{QueryConflictsByResource, collect(&r.ConflictsByResource, func(c *ResourceConflicts) []any {
			return []any{&c.APIGroup, &c.Resource, &c.WriteAttempts, &c.VersionConflicts, new(float64)}
		})},
		{QueryHotObjects, collect(&r.HotObjects, func(h *HotObject) []any {
			return []any{&h.APIGroup, &h.Resource, &h.Namespace, &h.Name, &h.WriteAttempts, &h.DistinctWriters, &h.VersionConflicts, new(float64)}
		})},
		{QueryRetryLoops, func(rows driver.Rows) error {
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
		{QueryStamplessUpdates, collect(&r.StamplessUpdates, func(s *StamplessUpdates) []any {
			return []any{&s.User, &s.APIGroup, &s.Resource, &s.Namespace, &s.Name, &s.Count}
		})},
		{QueryLeaseHolderChanges, collect(&r.LeaseHolderChanges, func(l *LeaseChanges) []any {
			return []any{&l.Namespace, &l.Name, &l.Changes, &l.Holders}
		})},
		{QueryPolicyDecisions, collect(&r.PolicyDecisions, func(p *PolicyDecisions) []any {
			return []any{&p.Policy, &p.Kind, &p.Action, &p.Count}
		})},
	}
	if o.History {
		runs = append(runs,
			run{QueryLostUpdates, scanLostUpdates(&r.LostUpdates)},
			run{QueryFieldFights, func(rows driver.Rows) error {
				var f FieldFight
				var first, last uint64
				err := rows.Scan(&f.APIGroup, &f.Resource, &f.Namespace, &f.Name, &f.Field, &f.Writers, &f.Changes, &f.Handoffs, &first, &last)
				f.First, f.Last = microsTime(first), microsTime(last)
				r.FieldFights = append(r.FieldFights, f)
				return err
			}},
			run{QueryFieldWriters, scanFieldWriters(&r.FieldWriters)},
			run{QueryConflictCauses, collect(&r.ConflictCauses, func(c *ConflictCause) []any {
				return []any{&c.Writer, &c.BlockedBy, &c.Conflicts}
			})},
			run{QueryNoopWrites, collect(&r.NoopWrites, func(n *NoopWrites) []any {
				return []any{&n.User, &n.Count}
			})},
		)
	}
	// The totals first, alone: the findings then read at least the
	// events the totals counted (a write's history is stored before its
	// event), so a report whose totals count every request of a window
	// holds every finding of it, however the other queries are ordered
	// (parallel starts the history's first).
	if err := q.each(QueryTotals, t.scan); err != nil {
		return nil, err
	}
	if err := q.parallel(o.parallel, runs...); err != nil {
		return nil, err
	}
	if t.Requests == 0 {
		return r, ErrNoEvents
	}
	return r, nil
}

// scanLostUpdates appends each row of QueryLostUpdates to dst.
func scanLostUpdates(dst *[]LostUpdate) func(driver.Rows) error {
	return func(rows driver.Rows) error {
		var l LostUpdate
		var at, overwritten uint64
		err := rows.Scan(&l.APIGroup, &l.Resource, &l.Namespace, &l.Name, &l.Field, &l.Writer, &l.OverwrittenWriter, &l.Cause,
			&l.AuditID, &l.OverwrittenAuditID, &at, &overwritten)
		l.Time, l.OverwrittenTime = microsTime(at), microsTime(overwritten)
		*dst = append(*dst, l)
		return err
	}
}

// scanFieldWriters appends each row of QueryFieldWriters to dst.
func scanFieldWriters(dst *[]FieldWriter) func(driver.Rows) error {
	return func(rows driver.Rows) error {
		var f FieldWriter
		var first, last uint64
		err := rows.Scan(&f.APIGroup, &f.Resource, &f.Namespace, &f.Field, &f.Writer, &f.Changes, &f.Objects, &first, &last)
		f.First, f.Last = microsTime(first), microsTime(last)
		*dst = append(*dst, f)
		return err
	}
}

// microsTime writes Unix microseconds as the report writes instants.
func microsTime(us uint64) string { return time.UnixMicro(int64(us)).UTC().Format(TimeFormat) }

// split decides where the window is read from: the clean hours of the
// window from their caches (and the whole minutes of the hours it cuts;
// the counters by writer from the writer caches when the filters allow),
// the rest from events (all of it with NoRollup).
func (o *Options) split(ctx context.Context, conn driver.Conn) error {
	if o.NoRollup {
		o.plan = asql.PlanReport(o.Since, o.Until, nil)
		return nil
	}
	from, to := o.Since.UTC().Truncate(time.Hour), ceilHour(o.Until)
	var clean []asql.CleanHour
	if from.Before(to) {
		q := "SELECT toUInt32(hour), version FROM " + strings.ReplaceAll(asql.CleanHours(strconv.FormatInt(from.Unix(), 10), strconv.FormatInt(to.Unix(), 10)), "{db}", o.Database) + " ORDER BY hour"
		if err := scanHours(ctx, conn, q, func(c asql.CleanHour) { clean = append(clean, c) }); err != nil {
			return fmt.Errorf("read the clean hours: %w", err)
		}
	}
	o.plan = asql.PlanReport(o.Since, o.Until, clean)
	if o.History && len(o.plan.Clean) > 1 && !o.hoursOnly {
		if err := o.readBlocks(ctx, conn, from, to); err != nil {
			return err
		}
	}
	if o.History && o.plan.CachesOnly() {
		return o.readInterleaved(ctx, conn)
	}
	return nil
}

// maxInterleaved bounds the objects whose clean hours interleave that a
// report reads into its plan (their hashes become the statements' SQL);
// past it, each statement finds them itself.
const maxInterleaved = 1000

// readInterleaved reads, for a plan of clean hours alone, the objects
// whose hours interleave: a function of the caches the plan pinned, read
// once for every statement on the field changes.
func (o *Options) readInterleaved(ctx context.Context, conn driver.Conn) error {
	rows, err := conn.Query(ctx, asql.Report{Database: o.Database, Plan: o.plan}.InterleavedObjects(), o.args()...)
	if err != nil {
		return fmt.Errorf("read the objects whose clean hours interleave: %w", err)
	}
	defer rows.Close()
	var hs []uint64
	for rows.Next() {
		var h uint64
		if err := rows.Scan(&h); err != nil {
			return fmt.Errorf("read the objects whose clean hours interleave: %w", err)
		}
		if hs = append(hs, h); len(hs) > maxInterleaved {
			return nil
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the objects whose clean hours interleave: %w", err)
	}
	o.plan.Interleaved, o.plan.InterleavedRead = hs, true
	return nil
}

// readBlocks reads the block records of [from, to) and puts in the plan
// the blocks of its clean hours whose hours' versions are the plan's
// (Plan.ChooseBlocks): the field changes stitch their field bounds in
// place of their hours'.
func (o *Options) readBlocks(ctx context.Context, conn driver.Conn, from, to time.Time) error {
	rows, err := conn.Query(ctx, strings.ReplaceAll(asql.Blocks, "{db}", o.Database),
		clickhouse.Named("from_s", uint32(from.Unix())), clickhouse.Named("to_s", uint32(to.Unix())))
	if err != nil {
		return fmt.Errorf("read the block records: %w", err)
	}
	defer rows.Close()
	var records []asql.BlockRecord
	for rows.Next() {
		var r asql.BlockRecord
		if err := asql.ScanBlockRecord(rows.Scan, &r); err != nil {
			return fmt.Errorf("read the block records: %w", err)
		}
		records = append(records, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the block records: %w", err)
	}
	o.plan.ChooseBlocks(records)
	return nil
}

// scanHours runs q, a query of (hour as Unix seconds, version), and hands
// each row to add.
func scanHours(ctx context.Context, conn driver.Conn, q string, add func(asql.CleanHour)) error {
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var h uint32
		var c asql.CleanHour
		if err := rows.Scan(&h, &c.Version); err != nil {
			return err
		}
		c.Hour = time.Unix(int64(h), 0).UTC()
		add(c)
	}
	return rows.Err()
}

// ceilHour is t rounded up to a whole UTC hour.
func ceilHour(t time.Time) time.Time {
	h := t.UTC().Truncate(time.Hour)
	if h.Before(t) {
		h = h.Add(time.Hour)
	}
	return h
}

// args binds the options to the queries' parameters.
func (o *Options) args() []any {
	return []any{
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
		clickhouse.Named(asql.MinHandoffs.Name, uint64(o.FightHandoffs)),
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
	log    *slog.Logger
}

func (o *Options) querier(ctx context.Context, conn driver.Conn) querier {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return querier{ctx: ctx, conn: conn, args: o.args(), log: log,
		binder: asql.Report{Database: o.Database, Plan: o.plan, Narrowed: o.narrowed()}}
}

// narrowed are the filters the options give a value.
func (o *Options) narrowed() []asql.Param {
	var ps []asql.Param
	for _, f := range []struct {
		param asql.Param
		value string
	}{{asql.Namespace, o.Namespace}, {asql.Resource, o.Resource}, {asql.User, o.User}} {
		if f.value != "" {
			ps = append(ps, f.param)
		}
	}
	return ps
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
// Each handler is called from one goroutine only. The queries that read
// the field history's segments start first, in the order given (the
// longest first): they take the longest (BENCHMARKS.md), and the others
// then fill the slots around them, instead of one of them running alone
// at the end.
func (q querier) parallel(n int, runs ...run) error {
	errs := make([]error, len(runs))
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, i := range segmentsFirst(runs) {
		r := runs[i]
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
	defer func(start time.Time) {
		q.log.Debug("report statement", "name", query.Name, "elapsed", time.Since(start))
	}(time.Now())
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

// segmentsFirst is the order in which parallel starts runs: the indexes
// of those whose query reads the field history's segments, then the
// others', each in the order given.
func segmentsFirst(runs []run) []int {
	var first, rest []int
	for i, r := range runs {
		if r.query.ReadsSegments() {
			first = append(first, i)
		} else {
			rest = append(rest, i)
		}
	}
	return append(first, rest...)
}
