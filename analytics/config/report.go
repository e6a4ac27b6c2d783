package config

import (
	"flag"
	"io"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
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
}

// Register binds r to the flags of report, with the Default* values.
func (r *ReportConfig) Register(fs *flag.FlagSet) {
	r.Config.Register(fs)
	registerCluster(fs, &r.Cluster, "the source cluster `name` the events were stored under")
	fs.StringVar(&r.Since, "since", DefaultSince, "start of the `time` window: RFC3339, or a duration ago (2h, 7d)")
	fs.StringVar(&r.Until, "until", "", "end of the window (exclusive), a `time`: RFC3339, or a duration ago (default now)")
	fs.IntVar(&r.Top, "top", report.DefaultTop, "rows per list, 1 or more")
	fs.StringVar(&r.Namespace, "namespace", "", "only this `namespace`")
	fs.StringVar(&r.Resource, "resource", "", "only this `resource` (plural, e.g. deployments)")
	fs.StringVar(&r.User, "user", "", "only this writer (the impersonated `user` when present)")
	fs.StringVar(&r.Format, "format", "table", "output `format`: table or json")
	fs.DurationVar(&r.LoopGap, "loop-gap", report.DefaultLoopGap, "longest pause inside a retry loop")
	fs.IntVar(&r.LoopThreshold, "loop-threshold", report.DefaultLoopThreshold, "fewest consecutive conflicts that make a retry loop, 2 or more")
	fs.IntVar(&r.FightHandoffs, "fight-handoffs", report.DefaultFightHandoffs, "fewest handoffs of a field between writers (in the window) that make a field fight, 2 or more; with --history")
	fs.BoolVar(&r.History, "history", false, "also report lost updates, field fights, conflict causes and no-op writes from the field history (read raw: slow on busy days, see BENCHMARKS.md)")
}

// Report is a validated ReportConfig.
type Report struct {
	*Connection
	Options report.Options
	JSON    bool
}

// Resolve validates r; now is the end of the window without --until.
func (r *ReportConfig) Resolve(now time.Time, w io.Writer) (*Report, error) {
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
		LoopGap: r.LoopGap, LoopThreshold: r.LoopThreshold, History: r.History, FightHandoffs: r.FightHandoffs, Until: now}
	var err error
	if o.Since, err = cli.ParseTime(r.Since, now); err != nil {
		return nil, cli.Usagef("--since: %w", err)
	}
	if r.Until != "" {
		if o.Until, err = cli.ParseTime(r.Until, now); err != nil {
			return nil, cli.Usagef("--until: %w", err)
		}
	}
	if !o.Since.Before(o.Until) {
		return nil, cli.Usagef("--since %s is not before --until %s: the window is empty", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	conn, err := r.Connect(w)
	if err != nil {
		return nil, err
	}
	o.Database = conn.Store.Database
	return &Report{Connection: conn, Options: o, JSON: r.Format == "json"}, nil
}
