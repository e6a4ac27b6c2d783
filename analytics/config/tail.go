package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/internal/cli"
)

// TailConfig is what `auditsink tail PATH` reads.
type TailConfig struct {
	WriteConfig
	// Checkpoint is --checkpoint; defaulted to PATH.auditsink-checkpoint.
	Checkpoint string
	// MetricsListen is --metrics-listen; empty (the default) serves none.
	MetricsListen string
}

// Register binds t to the flags of tail.
func (t *TailConfig) Register(fs *flag.FlagSet) {
	t.WriteConfig.Register(fs)
	fs.StringVar(&t.Checkpoint, "checkpoint", "", "checkpoint `file` (default PATH.auditsink-checkpoint)")
	fs.StringVar(&t.MetricsListen, "metrics-listen", "", "`address` of a plain-HTTP /metrics endpoint (empty: off)")
}

// Tail is a validated TailConfig.
type Tail struct {
	*Connection
	Path          string
	MetricsListen string
	// Options lack Metrics, which the command adds when it serves them.
	Options pipeline.TailOptions
}

// Resolve validates t and PATH: a readable file, or one that does not
// exist yet in a directory that does (tail follows it from its first
// appearance, and says so); the checkpoint's directory must exist.
func (t *TailConfig) Resolve(operands []string, w io.Writer) (*Tail, error) {
	if len(operands) != 1 {
		return nil, cli.Usagef("give one PATH: auditsink tail [flags] PATH")
	}
	path := operands[0]
	_, statErr := os.Stat(path)
	switch {
	case errors.Is(statErr, os.ErrNotExist):
		if err := checkDir(filepath.Dir(path), "PATH"); err != nil {
			return nil, err
		}
	default:
		if err := checkReadable(path); err != nil {
			return nil, err
		}
	}
	checkpoint := t.Checkpoint
	if checkpoint == "" {
		checkpoint = path + ".auditsink-checkpoint"
	}
	if err := checkDir(filepath.Dir(checkpoint), "--checkpoint"); err != nil {
		return nil, err
	}
	conn, err := t.Connect(w)
	if err != nil {
		return nil, err
	}
	if statErr != nil {
		conn.Logger.Info("the audit log does not exist yet; following it from its first appearance", "path", path)
	}
	return &Tail{Connection: conn, Path: path, MetricsListen: t.MetricsListen,
		Options: pipeline.TailOptions{Cluster: t.Cluster, Accepter: t.Accepter(), CheckpointPath: checkpoint, Logger: conn.Logger}}, nil
}
