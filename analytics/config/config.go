// Package config is the options boundary of the auditsink command: every
// subcommand's flags, their defaults (the Default* constants, and those of
// the libraries they feed), and their resolution into the options of
// sink.Run, the pipeline's ingest and tail, the store and the report. The
// rule, for every option that has both: an explicit flag beats the
// environment, and the environment beats files and defaults. Everything
// is validated before the subcommand touches ClickHouse or the disk; a
// validation error is a cli.UsageError (exit 2).
package config

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/stampguard/stampguard/analytics/sink"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/cli"
)

// The environment variables the auditsink commands read.
const (
	// DSNEnv holds the ClickHouse DSN when neither --clickhouse nor
	// --clickhouse-dsn-file is given.
	DSNEnv = "AUDITSINK_CLICKHOUSE_DSN"
	// ClickHouseClusterEnv is the default of --clickhouse-cluster.
	ClickHouseClusterEnv = "AUDITSINK_CLICKHOUSE_CLUSTER"
	// TokenEnv holds the bearer token of serve when no token file is
	// given.
	TokenEnv = "AUDITSINK_TOKEN"
)

// The defaults of the auditsink flags.
const (
	// DefaultDatabase is --database's default.
	DefaultDatabase = "stampguard"
	// DefaultLogLevel is --log-level's default.
	DefaultLogLevel = "info"
	// DefaultMetricsListen is serve's --metrics-listen default.
	DefaultMetricsListen = ":9090"
	// DefaultSpoolDir is serve's --spool-dir default.
	DefaultSpoolDir = "/var/lib/auditsink/spool"
	// DefaultSpoolMax is serve's --spool-max default.
	DefaultSpoolMax = "1GiB"
	// DefaultMaxBody is serve's --max-body default (sink.DefaultMaxBodyBytes).
	DefaultMaxBody = "1GiB"
	// DefaultInsertParallel is serve's --insert-parallel default.
	DefaultInsertParallel = 2
	// DefaultServeMemoryLimit is serve's --memory-limit default.
	DefaultServeMemoryLimit = "240MiB"
	// DefaultIngestMemoryLimit is ingest's --memory-limit default.
	DefaultIngestMemoryLimit = "200MiB"
	// DefaultGCPercent is serve's --gc-percent default (Go's own).
	DefaultGCPercent = 100
	// DefaultSince is report's --since default.
	DefaultSince = "24h"
)

// Config is what every auditsink subcommand reads: where ClickHouse is
// and how to log. Register binds it to a flag set with the Default*
// values; Connect validates and resolves it.
type Config struct {
	// DSN is --clickhouse, the ClickHouse native DSN; no default.
	DSN string
	// DSNFile is --clickhouse-dsn-file, a file holding the DSN; no default.
	DSNFile string
	// Database is --database; DefaultDatabase. Empty is refused.
	Database string
	// ClickHouseCluster is --clickhouse-cluster; defaulted to
	// $AUDITSINK_CLICKHOUSE_CLUSTER (empty: one server).
	ClickHouseCluster string
	// LogLevel is --log-level (debug, info, warn, error); DefaultLogLevel.
	LogLevel string
}

// Register binds c to the flags every subcommand shares.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.DSN, "clickhouse", "", "ClickHouse native `DSN`, e.g. clickhouse://127.0.0.1:9000; beats $"+DSNEnv+". Credentials belong in --clickhouse-dsn-file or $"+DSNEnv+", not in argv")
	fs.StringVar(&c.DSNFile, "clickhouse-dsn-file", "", "`file` holding the ClickHouse DSN (with user, password, secure=true); beats $"+DSNEnv)
	fs.StringVar(&c.Database, "database", DefaultDatabase, "ClickHouse `database`")
	fs.StringVar(&c.ClickHouseCluster, "clickhouse-cluster", os.Getenv(ClickHouseClusterEnv), "ClickHouse cluster `name` (from the servers' remote_servers) for sharded, replicated storage; empty: one server (default $"+ClickHouseClusterEnv+")")
	fs.StringVar(&c.LogLevel, "log-level", DefaultLogLevel, "log `level`: debug, info, warn or error")
}

// Connection is a validated Config: the store's options, where the DSN
// came from, and the logger.
type Connection struct {
	Store store.Options
	// From names where the DSN came from: a flag, a file or the
	// environment.
	From   string
	Logger *slog.Logger
}

// Connect validates c and resolves the DSN: --clickhouse or
// --clickhouse-dsn-file (not both), else $AUDITSINK_CLICKHOUSE_DSN. A
// password in --clickhouse, which the process list shows, is warned about
// on the logger (JSON on w). Nothing is connected to.
func (c *Config) Connect(w io.Writer) (*Connection, error) {
	log, err := c.logger(w)
	if err != nil {
		return nil, err
	}
	conn := &Connection{Logger: log}
	var dsn string
	switch {
	case c.DSN != "" && c.DSNFile != "":
		return nil, cli.Usagef("give --clickhouse or --clickhouse-dsn-file, not both")
	case c.DSNFile != "":
		b, err := os.ReadFile(c.DSNFile)
		if err != nil {
			return nil, cli.Usagef("--clickhouse-dsn-file: %w", err)
		}
		if dsn = strings.TrimSpace(string(b)); dsn == "" {
			return nil, cli.Usagef("--clickhouse-dsn-file %s is empty", c.DSNFile)
		}
		conn.From = "--clickhouse-dsn-file " + c.DSNFile
	case c.DSN != "":
		dsn, conn.From = c.DSN, "--clickhouse"
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			if _, hasPassword := u.User.Password(); hasPassword {
				log.Warn("the ClickHouse DSN on the command line holds a password that other users can read in the process list; use --clickhouse-dsn-file or $" + DSNEnv)
			}
		}
	case os.Getenv(DSNEnv) != "":
		dsn, conn.From = os.Getenv(DSNEnv), "$"+DSNEnv
	default:
		return nil, cli.Usagef("no ClickHouse DSN: give --clickhouse, --clickhouse-dsn-file or $%s", DSNEnv)
	}
	if c.Database == "" {
		return nil, cli.Usagef("--database is empty: name a database (default %s)", DefaultDatabase)
	}
	if err := asql.ValidDatabase(c.Database); err != nil {
		return nil, cli.Usagef("--database: %w", err)
	}
	conn.Store = store.Options{DSN: dsn, Database: c.Database, ClickHouseCluster: c.ClickHouseCluster}
	if err := conn.Store.Check(); err != nil {
		return nil, cli.Usagef("%s: %w", conn.From, err)
	}
	return conn, nil
}

func (c *Config) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, cli.Usagef("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: cli.DurationsAsText})), nil
}

// String names the server and where its DSN came from, for errors.
func (c *Connection) String() string {
	host := "?"
	if o, err := store.ParseDSN(c.Store.DSN); err == nil && len(o.Addr) > 0 {
		host = strings.Join(o.Addr, ",")
	}
	return fmt.Sprintf("ClickHouse at %s (DSN from %s)", host, c.From)
}

// Open connects to the store; the errors name the server.
func (c *Connection) Open(ctx context.Context) (*store.Store, error) {
	st, err := store.Open(ctx, c.Store)
	if err != nil {
		return nil, c.Err(err)
	}
	return st, nil
}

// OpenMigrated connects to the store and applies the migrations.
func (c *Connection) OpenMigrated(ctx context.Context) (*store.Store, error) {
	st, err := c.Open(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, c.Err(err)
	}
	return st, nil
}

// Err is err of a query against the store, with the database, the server
// and where its DSN came from; a server that does not speak ClickHouse's
// native protocol is told so.
func (c *Connection) Err(err error) error {
	hint := ""
	if strings.Contains(err.Error(), "[handshake]") {
		hint = " (not ClickHouse's native protocol: is it the native port, 9000 by default, rather than HTTP's 8123?)"
	}
	return fmt.Errorf("database %s on %s%s: %w", c.Store.Database, c, hint, err)
}

// registerCluster binds --cluster, the source cluster, with its default.
func registerCluster(fs *flag.FlagSet, p *string, usage string) {
	fs.StringVar(p, "cluster", sink.DefaultCluster, usage)
}

func checkCluster(name string) error {
	if !sink.IsClusterName(name) {
		return cli.Usagef("--cluster %q: want letters, digits, '-', '_' and '.', starting with a letter or digit, at most 63", name)
	}
	return nil
}
