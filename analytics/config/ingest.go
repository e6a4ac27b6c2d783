package config

import (
	"flag"
	"io"
	"os"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/internal/cli"
)

// IngestConfig is what `auditsink ingest FILE...` reads.
type IngestConfig struct {
	WriteConfig
	// NoProgress is --no-progress: no progress bar even on a terminal.
	NoProgress bool
	// MemoryLimit is --memory-limit; DefaultIngestMemoryLimit.
	MemoryLimit string
}

// Register binds i to the flags of ingest.
func (i *IngestConfig) Register(fs *flag.FlagSet) {
	i.WriteConfig.Register(fs)
	fs.BoolVar(&i.NoProgress, "no-progress", false, "no progress bar even on a terminal")
	fs.StringVar(&i.MemoryLimit, "memory-limit", DefaultIngestMemoryLimit, "soft memory `limit` of the Go runtime (GOMEMLIMIT beats it)")
}

// Ingest is a validated IngestConfig.
type Ingest struct {
	*Connection
	Files       []string
	Options     pipeline.IngestOptions
	MemoryLimit int64
}

// Resolve validates i and the files (each must be a readable file). The
// logs go to w, and so does the progress line, when w is a terminal and
// --no-progress is not given: a redirected or captured stream gets none.
func (i *IngestConfig) Resolve(files []string, w io.Writer) (*Ingest, error) {
	if len(files) == 0 {
		return nil, cli.Usagef("no FILE given: auditsink ingest [flags] FILE...")
	}
	mem, err := memoryLimit(i.MemoryLimit)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := checkReadable(f); err != nil {
			return nil, err
		}
	}
	conn, err := i.Connect(w)
	if err != nil {
		return nil, err
	}
	in := &Ingest{Connection: conn, Files: files, MemoryLimit: mem,
		Options: pipeline.IngestOptions{Cluster: i.Cluster, Accepter: i.Accepter(), Logger: conn.Logger}}
	if !i.NoProgress && isTerminal(w) {
		in.Options.Progress = w
	}
	return in, nil
}

// isTerminal tells whether w is a character device, as a terminal is.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func checkReadable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return cli.Usage(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return cli.Usage(err)
	}
	if fi.IsDir() {
		return cli.Usagef("%s is a directory, not an audit log file", path)
	}
	return nil
}

// checkDir refuses a directory (of what) that is not there.
func checkDir(dir, what string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return cli.Usagef("%s: directory %w", what, err)
	}
	if !fi.IsDir() {
		return cli.Usagef("%s: %s is not a directory", what, dir)
	}
	return nil
}
