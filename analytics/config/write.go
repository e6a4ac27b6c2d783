package config

import (
	"bytes"
	"flag"
	"io"
	"os"
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
	history *audit.FieldHasher // from NoHistory and HistoryKeyFile, set by Connect
	// NoHistory is --no-field-history: store no field histories.
	NoHistory bool
	// HistoryKeyFile is --history-key-file: the file whose bytes key the
	// field histories' value hashes; every sink of a cluster must use the
	// same. Without it the key is empty (hashes then hide no value from
	// who can guess it).
	HistoryKeyFile string
}

// Register binds w to the shared flags and the writers' own.
func (w *WriteConfig) Register(fs *flag.FlagSet) {
	w.Config.Register(fs)
	registerCluster(fs, &w.Cluster, "source cluster `name` stored with each event")
	fs.StringVar(&w.Stages, "stages", strings.Join(audit.DefaultStages, ","), "audit `stages` to store")
	fs.StringVar(&w.RedactResources, "redact-resources", "", "comma-separated `resources` whose request and response objects are dropped like those of secrets (always dropped)")
	fs.BoolVar(&w.KeepRaw, "keep-raw", false, "store each event's raw JSON (secrets redacted) in events.raw")
	fs.BoolVar(&w.NoHistory, "no-field-history", false, "store no field history (what each write logged with its response changed; the lost-update findings need it)")
	fs.StringVar(&w.HistoryKeyFile, "history-key-file", "", "`file` whose bytes key the hashes of field values in the field history; the same for every sink of a cluster")
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
	if w.history, err = w.fieldHasher(); err != nil {
		return nil, err
	}
	return conn, nil
}

// fieldHasher is the field history's hasher w configures, nil for none.
func (w *WriteConfig) fieldHasher() (*audit.FieldHasher, error) {
	if w.NoHistory {
		if w.HistoryKeyFile != "" {
			return nil, cli.Usagef("--history-key-file keys the field history, which --no-field-history turns off: pass one of them")
		}
		return nil, nil
	}
	var key []byte
	if w.HistoryKeyFile != "" {
		var err error
		if key, err = os.ReadFile(w.HistoryKeyFile); err != nil {
			return nil, cli.Usagef("--history-key-file: %v", err)
		}
		if key = bytes.TrimSpace(key); len(key) == 0 {
			return nil, cli.Usagef("--history-key-file %s is empty: write a secret into it (e.g. head -c 32 /dev/urandom | base64)", w.HistoryKeyFile)
		}
	}
	h := audit.NewFieldHasher(key)
	return &h, nil
}

// Accepter decodes and filters events as w says (after Connect).
func (w *WriteConfig) Accepter() *pipeline.Accepter {
	return sink.NewAccepter(SplitList(w.Stages), SplitList(w.RedactResources), w.KeepRaw, w.history)
}
