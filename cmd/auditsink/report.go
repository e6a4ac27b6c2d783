package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/analytics/sink"
)

func reportCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c sink.Config
	c.Register(fs)
	since := fs.String("since", "24h", "start of the window: RFC3339 or a duration ago (2h, 7d)")
	until := fs.String("until", "", "end of the window (exclusive): RFC3339 or a duration ago; default now")
	top := fs.Int("top", 10, "rows per list")
	namespace := fs.String("namespace", "", "only this namespace")
	resource := fs.String("resource", "", "only this resource (plural, e.g. deployments)")
	user := fs.String("user", "", "only this writer (the impersonated user when present)")
	format := fs.String("format", "table", "table or json")
	loopGap := fs.Duration("loop-gap", 5*time.Minute, "longest pause inside a retry loop")
	loopThreshold := fs.Int("loop-threshold", 5, "fewest consecutive conflicts that make a retry loop")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("--format %q: want table or json", *format)
	}
	now := time.Now().UTC()
	o := report.Options{
		Cluster: c.SourceCluster(), Top: *top, Namespace: *namespace, Resource: *resource, User: *user,
		LoopGap: *loopGap, LoopThreshold: *loopThreshold, Until: now,
	}
	var err error
	if o.Since, err = report.ParseTime(*since, now); err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	if *until != "" {
		if o.Until, err = report.ParseTime(*until, now); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
	}
	log, err := c.Logger(stderr)
	if err != nil {
		return err
	}
	st, err := c.Open(ctx, log)
	if err != nil {
		return err
	}
	defer st.Close()
	o.Database = st.Database()
	if _, err := st.SchemaVersion(ctx); err != nil {
		return fmt.Errorf("database %s holds no stampguard schema; check --database, or run auditsink migrate: %w", o.Database, err)
	}
	r, err := report.Build(ctx, st.Conn(), o)
	if err != nil && !errors.Is(err, report.ErrNoEvents) {
		return err
	}
	if *format == "json" {
		return report.WriteJSON(stdout, r)
	}
	return report.WriteTable(stdout, r, o)
}
