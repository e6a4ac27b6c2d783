package config

import (
	"flag"
	"io"
	"strings"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/sink"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/cli"
)

// WriteConfig is what the subcommands that store events (serve, ingest,
// tail) read beside Config: the source cluster and what to keep.
type WriteConfig struct {
	Config
	// Cluster is --cluster, the source cluster stored with each event;
	// DefaultCluster.
	Cluster string
	// Stages is --stages, a comma-separated list; audit.DefaultStages.
	Stages string
	// RedactResources is --redact-resources, a comma-separated list; no
	// default (secrets are always redacted).
	RedactResources string
	// KeepRaw is --keep-raw; off by default.
	KeepRaw bool
}

// Register binds w to the shared flags and the writers' own.
func (w *WriteConfig) Register(fs *flag.FlagSet) {
	w.Config.Register(fs)
	registerCluster(fs, &w.Cluster, "source cluster `name` stored with each event")
	fs.StringVar(&w.Stages, "stages", strings.Join(audit.DefaultStages, ","), "audit `stages` to store")
	fs.StringVar(&w.RedactResources, "redact-resources", "", "comma-separated `resources` whose request and response objects are dropped like those of secrets (always dropped)")
	fs.BoolVar(&w.KeepRaw, "keep-raw", false, "store each event's raw JSON (secrets redacted) in events.raw")
}

// Connect validates w (Config.Connect, the cluster and the stages).
func (w *WriteConfig) Connect(out io.Writer) (*Connection, error) {
	conn, err := w.Config.Connect(out)
	if err != nil {
		return nil, err
	}
	if err := checkCluster(w.Cluster); err != nil {
		return nil, err
	}
	if len(SplitList(w.Stages)) == 0 {
		return nil, cli.Usagef("--stages is empty: name the audit stages to store (default %s)", strings.Join(audit.DefaultStages, ","))
	}
	conn.Store.KeepRaw = w.KeepRaw
	return conn, nil
}

// Accepter decodes and filters events as w says.
func (w *WriteConfig) Accepter() *pipeline.Accepter {
	return sink.NewAccepter(SplitList(w.Stages), SplitList(w.RedactResources), w.KeepRaw)
}
