package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/stampguard/stampguard/analytics/config"
	"github.com/stampguard/stampguard/analytics/suggest"
)

func suggestCmd(fs *flag.FlagSet, stdout, stderr io.Writer) func([]string) (work, error) {
	var c config.SuggestConfig
	c.Register(fs)
	return func(files []string) (work, error) {
		s, err := c.Resolve(files, time.Now().UTC(), stderr)
		if err != nil {
			return nil, err
		}
		if s.Files != nil {
			return func(ctx context.Context) error {
				return suggest.FromFiles(ctx, *s.Files, s.Options, s.Replay, stdout)
			}, nil
		}
		return func(ctx context.Context) error {
			st, err := s.Open(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			if err := st.Conn().Ping(ctx); err != nil {
				return s.Err(err)
			}
			if _, err := st.SchemaVersion(ctx); err != nil {
				return fmt.Errorf("database %s on %s holds no stampguard schema; check --database, or run auditsink migrate: %w", s.Report.Options.Database, s, err)
			}
			return suggest.FromServer(ctx, st.Conn(), s.Report.Options, s.Options, stdout)
		}, nil
	}
}
