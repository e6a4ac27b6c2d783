package config

import (
	"flag"
	"io"
	"time"

	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/cli"
)

// MigrateConfig is what `auditsink migrate` reads.
type MigrateConfig struct {
	Config
	// Retention is --retention (ParseRetention); empty drops nothing.
	Retention string
	// Compact is --compact: build the hour caches of every closed hour
	// that needs it, and delete the cache versions superseded PruneAfter
	// ago or longer (store.Prune).
	Compact bool
	// PruneAfter is --prune-after.
	PruneAfter time.Duration
}

// Register binds m to the flags of migrate.
func (m *MigrateConfig) Register(fs *flag.FlagSet) {
	m.Config.Register(fs)
	fs.StringVar(&m.Retention, "retention", "", "also drop day partitions older than this `age`, e.g. 30d (empty: drop none)")
	fs.BoolVar(&m.Compact, "compact", true, "build the hour caches of every closed hour, of any day, that needs it, and delete the cache versions superseded --prune-after ago or longer (the figures are the same without; reports are faster)")
	fs.DurationVar(&m.PruneAfter, "prune-after", store.DefaultPruneAfter, "with --compact, how long a superseded cache version stays: longer than any report or panel query runs")
}

// Migrate is a validated MigrateConfig.
type Migrate struct {
	*Connection
	// Retention is 0 to drop nothing.
	Retention time.Duration
	Compact   bool
	// PruneAfter is how long a superseded cache version stays
	// (store.Prune).
	PruneAfter time.Duration
}

// Resolve validates m.
func (m *MigrateConfig) Resolve(w io.Writer) (*Migrate, error) {
	keep, err := ParseRetention(m.Retention)
	if err != nil {
		return nil, err
	}
	if m.PruneAfter < 0 {
		return nil, cli.Usagef("--prune-after %s: negative", m.PruneAfter)
	}
	conn, err := m.Connect(w)
	if err != nil {
		return nil, err
	}
	return &Migrate{Connection: conn, Retention: keep, Compact: m.Compact, PruneAfter: m.PruneAfter}, nil
}
