package suggest

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics/filereport"
	"github.com/stampguard/stampguard/analytics/report"
)

// FromFiles drafts the policies the audit log files support (their events
// stored in ClickHouse's engine in process, as `auditsink report FILE...`
// does), replays the drafts over the same files and window, and writes
// them to w. fo.Report's window, filters and database are the report's;
// ro's files and window are set from fo.
func FromFiles(ctx context.Context, fo filereport.Options, o Options, ro ReplayOptions, w io.Writer) error {
	s, err := filereport.Open(ctx, fo)
	if err != nil {
		return err
	}
	defer s.Close()
	drafts, err := observe(ctx, s.Conn(), s.Options, o)
	if err != nil {
		return err
	}
	ro.Files, ro.Since, ro.Until = fo.Files, s.Options.Since, s.Options.Until
	if err := Replay(ctx, drafts, ro); err != nil {
		return err
	}
	return Write(w, header(s.Options, strings.Join(fo.Files, ", "), o), drafts)
}

// FromServer drafts the policies the history stored on a ClickHouse
// server supports, for rep's window and filters. The server holds no
// request bodies to replay them over: the output says so, and `webhook
// replay` replays them over the audit log files.
func FromServer(ctx context.Context, conn driver.Conn, rep report.Options, o Options, w io.Writer) error {
	drafts, err := observe(ctx, conn, rep, o)
	if err != nil {
		return err
	}
	h := header(rep, "database "+rep.Database+", cluster "+rep.Cluster, o)
	h.NotReplayed = "the history came from a ClickHouse server, which keeps no request bodies; replay the drafts over the audit log files with `webhook replay --policy-file`"
	return Write(w, h, drafts)
}

func observe(ctx context.Context, conn driver.Conn, rep report.Options, o Options) ([]Draft, error) {
	obs, err := report.Observe(ctx, conn, rep)
	if err != nil {
		return nil, fmt.Errorf("read the history: %w", err)
	}
	return Build(obs, o)
}

func header(rep report.Options, source string, o Options) Header {
	return Header{Since: rep.Since.UTC().Format(report.TimeFormat), Until: rep.Until.UTC().Format(report.TimeFormat), Source: source, Options: o}
}
