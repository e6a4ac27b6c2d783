package config

import (
	"cmp"
	"flag"
	"io"
	"os"
	"time"

	"github.com/stampguard/stampguard/analytics/filereport"
	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/internal/chdb"
	"github.com/stampguard/stampguard/internal/cli"
)

// ReportConfig is what `auditsink report` reads.
type ReportConfig struct {
	Config
	Cluster, Since, Until, Namespace, Resource, User, Format string
	Top, LoopThreshold, FightHandoffs                        int
	LoopGap                                                  time.Duration
	// History is --history: the findings on the field history.
	History bool
	// CHDB is --chdb, the engine library of a report from files; empty:
	// chdb.Find's search ($CHDB_LIB_PATH, beside the executable, the
	// system's library directories).
	CHDB string
	// Keep is --keep, the directory the engine's data of a report from
	// files is kept in; empty: a temporary one, removed.
	Keep string
	// NoProgress is --no-progress: no progress line even on a terminal.
	NoProgress bool
}

// Register binds r to the flags of report, with the Default* values.
func (r *ReportConfig) Register(fs *flag.FlagSet) {
	r.registerSource(fs)
	fs.IntVar(&r.Top, "top", report.DefaultTop, "rows per list, 1 or more")
	fs.StringVar(&r.User, "user", "", "only this writer (the impersonated `user` when present)")
	fs.StringVar(&r.Format, "format", "table", "output `format`: table or json")
	fs.DurationVar(&r.LoopGap, "loop-gap", report.DefaultLoopGap, "longest pause inside a retry loop")
	fs.IntVar(&r.LoopThreshold, "loop-threshold", report.DefaultLoopThreshold, "fewest consecutive conflicts that make a retry loop, 2 or more")
	fs.IntVar(&r.FightHandoffs, "fight-handoffs", report.DefaultFightHandoffs, "fewest handoffs of a field between writers (in the window) that make a field fight, 2 or more; with --history")
	fs.BoolVar(&r.History, "history", false, "also report lost updates, field fights, conflict causes and no-op writes from the field history (read raw: slow on busy days, see BENCHMARKS.md)")
}

// registerSource binds the flags that say where the history is and which
// part of it is read: the server (Config) or FILEs and their engine, the
// cluster, the window, the namespace and the resource. report and suggest
// share them.
func (r *ReportConfig) registerSource(fs *flag.FlagSet) {
	r.Config.Register(fs)
	registerCluster(fs, &r.Cluster, "the source cluster `name` the events were stored under")
	fs.StringVar(&r.Since, "since", "", "start of the `time` window: RFC3339, or a duration ago (2h, 7d); default "+DefaultSince+", or with FILEs the second of their first event")
	fs.StringVar(&r.Until, "until", "", "end of the window (exclusive), a `time`: RFC3339, or a duration ago; default now, or with FILEs just after their last event")
	fs.StringVar(&r.Namespace, "namespace", "", "only this `namespace`")
	fs.StringVar(&r.Resource, "resource", "", "only this `resource` (plural, e.g. deployments)")
	fs.StringVar(&r.CHDB, "chdb", "", "with FILEs: the engine library, libchdb.so or its directory (default $"+chdb.LibEnv+", else beside the executable, /usr/local/lib, /usr/lib, /usr/lib64)")
	fs.StringVar(&r.Keep, "keep", "", "with FILEs: keep the engine's data in this `directory` (made when missing), so that a later run over the same files reads only what is new in them; default a temporary directory, removed")
	fs.BoolVar(&r.NoProgress, "no-progress", false, "with FILEs: no progress line even on a terminal")
}

// Report is a validated ReportConfig: a report from a ClickHouse server
// (Connection), or from audit log files (Files).
type Report struct {
	*Connection
	// Files is the report from files (its Report is Options), nil for a
	// server's.
	Files   *filereport.Options
	Options report.Options
	JSON    bool
}

// Resolve validates r and the files (none: the report from a server);
// now is the end of the window without --until.
func (r *ReportConfig) Resolve(files []string, now time.Time, w io.Writer) (*Report, error) {
	if r.Format != "table" && r.Format != "json" {
		return nil, cli.Usagef("--format %q: want table or json", r.Format)
	}
	if r.Top < 1 {
		return nil, cli.Usagef("--top %d: want 1 or more rows per list", r.Top)
	}
	if r.LoopThreshold < 2 {
		return nil, cli.Usagef("--loop-threshold %d: want 2 or more conflicts (one conflict is no loop)", r.LoopThreshold)
	}
	if r.FightHandoffs < 2 {
		return nil, cli.Usagef("--fight-handoffs %d: want 2 or more (a field set back and forth changes hands twice)", r.FightHandoffs)
	}
	if r.LoopGap <= 0 {
		return nil, cli.Usagef("--loop-gap %s: want a positive duration", r.LoopGap)
	}
	if err := checkCluster(r.Cluster); err != nil {
		return nil, err
	}
	o := report.Options{Cluster: r.Cluster, Top: r.Top, Namespace: r.Namespace, Resource: r.Resource, User: r.User,
		LoopGap: r.LoopGap, LoopThreshold: r.LoopThreshold, History: r.History, FightHandoffs: r.FightHandoffs}
	since := r.Since
	if len(files) == 0 {
		// A server's window ends now and starts DefaultSince before; the
		// files' window is their span (filereport.Run).
		since = cmp.Or(since, DefaultSince)
		o.Until = now
	}
	var err error
	if since != "" {
		if o.Since, err = cli.ParseTime(since, now); err != nil {
			return nil, cli.Usagef("--since: %w", err)
		}
	}
	if r.Until != "" {
		if o.Until, err = cli.ParseTime(r.Until, now); err != nil {
			return nil, cli.Usagef("--until: %w", err)
		}
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && !o.Since.Before(o.Until) {
		return nil, cli.Usagef("--since %s is not before --until %s: the window is empty", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	rep := &Report{Options: o, JSON: r.Format == "json"}
	if len(files) > 0 {
		if rep.Files, err = r.resolveFiles(files, w); err != nil {
			return nil, err
		}
		rep.Files.Report = o
		return rep, nil
	}
	if r.CHDB != "" || r.Keep != "" {
		return nil, cli.Usagef("--chdb and --keep are for a report from FILEs, and none is given")
	}
	if rep.Connection, err = r.Connect(w); err != nil {
		return nil, err
	}
	rep.Options.Database, rep.Options.Logger = rep.Store.Database, rep.Logger
	return rep, nil
}

// resolveFiles validates the flags of a report from files.
func (r *ReportConfig) resolveFiles(files []string, w io.Writer) (*filereport.Options, error) {
	// The files first: a word meant as something else names a file that
	// is not there.
	for _, f := range files {
		if err := checkReadable(f); err != nil {
			return nil, err
		}
	}
	if r.DSN != "" || r.DSNFile != "" {
		return nil, cli.Usagef("give audit log FILEs or a ClickHouse server (--clickhouse, --clickhouse-dsn-file), not both")
	}
	if r.Database != DefaultDatabase {
		return nil, cli.Usagef("--database names a database on a ClickHouse server; a report from FILEs has its own")
	}
	if r.Keep != "" {
		if fi, err := os.Stat(r.Keep); err == nil && !fi.IsDir() {
			return nil, cli.Usagef("--keep %s is not a directory", r.Keep)
		}
	}
	log, err := r.logger(w)
	if err != nil {
		return nil, err
	}
	o := &filereport.Options{Files: files, Lib: r.CHDB, Keep: r.Keep, Cluster: r.Cluster, Logger: log}
	if !r.NoProgress && isTerminal(w) {
		o.Progress = w
	}
	return o, nil
}
