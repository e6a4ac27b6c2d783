package main

import (
	"context"
	"flag"
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
			st, err := openSchema(ctx, s.Connection)
			if err != nil {
				return err
			}
			defer st.Close()
			return suggest.FromServer(ctx, st.Conn(), s.Report.Options, s.Options, stdout)
		}, nil
	}
}
