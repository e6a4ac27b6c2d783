package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/stampguard/stampguard/analytics/config"
	"github.com/stampguard/stampguard/analytics/filereport"
	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/analytics/store"
)

func reportCmd(fs *flag.FlagSet, stdout, stderr io.Writer) func([]string) (work, error) {
	var c config.ReportConfig
	c.Register(fs)
	return func(files []string) (work, error) {
		r, err := c.Resolve(files, time.Now().UTC(), stderr)
		if err != nil {
			return nil, err
		}
		write := func(rep *report.Report, o report.Options, err error) error {
			if err != nil && !errors.Is(err, report.ErrNoEvents) {
				return err
			}
			if r.JSON {
				return report.WriteJSON(stdout, rep)
			}
			return report.WriteTable(stdout, rep, o)
		}
		if r.Files != nil {
			return func(ctx context.Context) error {
				res, err := filereport.Run(ctx, *r.Files)
				return write(res.Report, res.Options, err)
			}, nil
		}
		return func(ctx context.Context) error {
			st, err := openSchema(ctx, r.Connection)
			if err != nil {
				return err
			}
			defer st.Close()
			rep, err := report.Build(ctx, st.Conn(), r.Options)
			return write(rep, r.Options, err)
		}, nil
	}
}

// openSchema opens the store of a report or suggest from a server, and
// checks that it answers and holds the schema. A server that does not
// answer is not a missing schema: it is asked first, so that each
// failure is told as what it is.
func openSchema(ctx context.Context, c *config.Connection) (*store.Store, error) {
	st, err := c.Open(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Conn().Ping(ctx); err != nil {
		_ = st.Close()
		return nil, c.Err(err)
	}
	if _, err := st.SchemaVersion(ctx); err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("database %s on %s holds no stampguard schema; check --database, or run auditsink migrate: %w", c.Store.Database, c, err)
	}
	return st, nil
}
