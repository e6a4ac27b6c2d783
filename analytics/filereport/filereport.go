// Package filereport is the report from audit log files, with no server:
// `auditsink report FILE...`. The files' events go into ClickHouse's
// engine in this process (internal/chdb), stored by the very pipeline and
// schema of a server (pipeline.IngestFiles into store.OpenLocal), and the
// report runs the very statements of analytics/sql on them (report.Build).
// No figure has a second definition: a file report equals `auditsink
// ingest` of the same files followed by `auditsink report` on a server,
// for the same window and filters (test/e2e proves it).
//
// The engine's data lives in a temporary directory that is removed at the
// end, or in a directory the caller keeps (Options.Keep): a later report
// over the same files then reads only what is new in them (see keep.go).
package filereport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/report"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/chdb"
)

// DefaultDatabase is the database the events are stored in, inside the
// engine's directory.
const DefaultDatabase = "stampguard"

// Options configure Run.
type Options struct {
	// Files are the audit logs (JSON lines, plain or gzip, in any order;
	// a file given twice and events repeated across files count once).
	Files []string
	// Lib is libchdb.so or its directory; empty: chdb.Find's search.
	Lib string
	// Keep is the engine's data directory, created when missing and kept
	// afterwards; empty: a temporary directory, removed at the end.
	Keep string
	// Cluster is the source cluster the events are stored and reported
	// under.
	Cluster string
	// Report is the report's options. A zero Since or Until is the
	// files' span's: the second of the first event, and the second after
	// that of the last. Cluster and Database are set by Run.
	Report report.Options
	// Progress, when set, receives the ingest's progress line; give it a
	// terminal.
	Progress io.Writer
	Logger   *slog.Logger
}

// Result is what Run found.
type Result struct {
	Report *report.Report
	// Options are the report's options, with the window Run chose.
	Options report.Options
	// Ingest sums up what was read; zero when every file was found in
	// Keep already.
	Ingest pipeline.IngestResult
	// Reused lists the files whose events were found in Keep unchanged.
	Reused []string
}

// Run stores the files' events in the engine and builds the report. Like
// report.Build, it returns report.ErrNoEvents with the (empty) report when
// the window holds no request.
func Run(ctx context.Context, o Options) (Result, error) {
	s, err := Open(ctx, o)
	if err != nil {
		return s.result(), err
	}
	defer s.Close()
	res := s.result()
	start := time.Now()
	if o.Progress != nil {
		fmt.Fprint(o.Progress, "building the report ...")
	}
	res.Report, err = report.Build(ctx, s.Conn(), res.Options)
	if o.Progress != nil {
		fmt.Fprint(o.Progress, "\r\033[K") // the line erased
	}
	s.Logger.Debug("built the report", "elapsed", time.Since(start))
	return res, err
}

// Session is the files' events stored in the engine, open for queries
// until Close: what Run builds the report from, and what `auditsink
// suggest` reads its observations from.
type Session struct {
	// Options are the report's options, with the engine's database and
	// the window Open chose.
	Options report.Options
	// Ingest and Reused are as in Result.
	Ingest pipeline.IngestResult
	Reused []string
	Logger *slog.Logger

	st     *store.Store
	closes []func()
}

// Conn is the engine's connection.
func (s *Session) Conn() clickhouse.Conn { return s.st.Conn() }

// Close closes the engine and removes its data unless it is kept.
func (s *Session) Close() {
	for i := len(s.closes) - 1; i >= 0; i-- {
		s.closes[i]()
	}
	s.closes = nil
}

func (s *Session) result() Result {
	if s == nil {
		return Result{}
	}
	return Result{Options: s.Options, Ingest: s.Ingest, Reused: s.Reused}
}

// Open stores the files' events in the engine (only what Keep lacks of
// them) and chooses the window. On an error it returns what it has done
// so far, closed.
func Open(ctx context.Context, o Options) (s *Session, err error) {
	if len(o.Files) == 0 {
		return nil, errors.New("no audit log file given")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s = &Session{Logger: o.Logger}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	lib, err := chdb.Find(o.Lib)
	if err != nil {
		return s, err
	}
	dir := o.Keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "stampguard-report-"); err != nil {
			return s, err
		}
		s.closes = append(s.closes, func() { os.RemoveAll(dir) })
	}
	k, err := openKeep(dir, o.Cluster, o.Files)
	if err != nil {
		return s, err
	}
	s.closes = append(s.closes, k.unlock)
	e, err := chdb.Open(lib, dir)
	if err != nil {
		return s, err
	}
	s.closes = append(s.closes, func() { e.Close() })
	if s.st, err = store.OpenLocal(e, store.Options{Database: DefaultDatabase}); err != nil {
		return s, err
	}
	if s.Reused, err = k.prepare(e, o.Logger); err != nil {
		return s, err
	}
	if _, err := s.st.Migrate(ctx); err != nil {
		return s, fmt.Errorf("create the schema in the engine: %w", err)
	}
	if todo := k.toRead(); len(todo) > 0 {
		// The field history's value hashes need no secret key here: the
		// values are in the files, and the hashes stay on this machine.
		h := audit.NewFieldHasher(nil)
		acc := &pipeline.Accepter{Decoder: audit.Decoder{History: &h}}
		// A bare Inserter: the report reads the events themselves, which
		// is cheaper once than building the hour caches first.
		s.Ingest, err = pipeline.IngestFiles(ctx, inserter{s.st}, todo,
			pipeline.IngestOptions{Cluster: o.Cluster, Accepter: acc, Progress: o.Progress, Logger: o.Logger})
		if err != nil {
			return s, err
		}
		if err := k.commit(); err != nil {
			return s, err
		}
		o.Logger.Debug("stored the files' events in the engine", "files", len(todo), "result", s.Ingest.String())
		if s.Ingest.Rejected > 0 {
			o.Logger.Warn("lines of the files are not audit events the decoder accepts; the report leaves them out (auditsink ingest stores them in dead_letters with the reason)",
				"lines", s.Ingest.Rejected)
		}
	}
	ro := o.Report
	ro.Cluster, ro.Database = o.Cluster, s.st.Database()
	if ro.Logger == nil {
		ro.Logger = o.Logger
	}
	if ro.Since.IsZero() || ro.Until.IsZero() {
		first, last, err := span(ctx, s.st, o.Cluster)
		if err != nil {
			return s, err
		}
		if ro.Since.IsZero() {
			ro.Since = first
		}
		if ro.Until.IsZero() {
			ro.Until = last
		}
	}
	s.Options = ro
	return s, nil
}

// ErrNoFileEvents says that the files hold no event to report on.
var ErrNoFileEvents = errors.New("the files hold no audit event (JSON lines of audit.k8s.io Event): nothing to report")

// span is the stored events' window: [the second of the first, the
// second after the last).
func span(ctx context.Context, st *store.Store, cluster string) (since, until time.Time, err error) {
	var n, first, last uint64
	q := "SELECT count(), min(event_time_us), max(event_time_us) FROM " + st.Database() + "." + asql.EventsTable + " WHERE cluster = @cluster"
	if err := st.Conn().QueryRow(ctx, q, clickhouse.Named("cluster", cluster)).Scan(&n, &first, &last); err != nil {
		return since, until, fmt.Errorf("the files' time span: %w", err)
	}
	if n == 0 {
		return since, until, ErrNoFileEvents
	}
	since = time.UnixMicro(int64(first)).UTC().Truncate(time.Second)
	until = time.UnixMicro(int64(last)).UTC().Truncate(time.Second).Add(time.Second)
	return since, until, nil
}

// inserter hides the store's Compact from IngestFiles.
type inserter struct{ pipeline.Inserter }
