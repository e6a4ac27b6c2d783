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
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/report"
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
	// OpenStore checks the DSN and the cluster name; it connects only at
	// the first query.
	st, err := store.Open(context.Background(), conn.Store)
	if err != nil {
		return nil, cli.Usagef("%s: %w", conn.From, err)
	}
	_ = st.Close()
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

// ReportConfig is what `auditsink report` reads.
type ReportConfig struct {
	Config
	Cluster, Since, Until, Namespace, Resource, User, Format string
	Top, LoopThreshold                                       int
	LoopGap                                                  time.Duration
}

// Register binds r to the flags of report, with the Default* values.
func (r *ReportConfig) Register(fs *flag.FlagSet) {
	r.Config.Register(fs)
	registerCluster(fs, &r.Cluster, "the source cluster `name` the events were stored under")
	fs.StringVar(&r.Since, "since", DefaultSince, "start of the `time` window: RFC3339, or a duration ago (2h, 7d)")
	fs.StringVar(&r.Until, "until", "", "end of the window (exclusive), a `time`: RFC3339, or a duration ago (default now)")
	fs.IntVar(&r.Top, "top", report.DefaultTop, "rows per list, 1 or more")
	fs.StringVar(&r.Namespace, "namespace", "", "only this `namespace`")
	fs.StringVar(&r.Resource, "resource", "", "only this `resource` (plural, e.g. deployments)")
	fs.StringVar(&r.User, "user", "", "only this writer (the impersonated `user` when present)")
	fs.StringVar(&r.Format, "format", "table", "output `format`: table or json")
	fs.DurationVar(&r.LoopGap, "loop-gap", report.DefaultLoopGap, "longest pause inside a retry loop")
	fs.IntVar(&r.LoopThreshold, "loop-threshold", report.DefaultLoopThreshold, "fewest consecutive conflicts that make a retry loop, 2 or more")
}

// Report is a validated ReportConfig.
type Report struct {
	*Connection
	Options report.Options
	JSON    bool
}

// Resolve validates r; now is the end of the window without --until.
func (r *ReportConfig) Resolve(now time.Time, w io.Writer) (*Report, error) {
	if r.Format != "table" && r.Format != "json" {
		return nil, cli.Usagef("--format %q: want table or json", r.Format)
	}
	if r.Top < 1 {
		return nil, cli.Usagef("--top %d: want 1 or more rows per list", r.Top)
	}
	if r.LoopThreshold < 2 {
		return nil, cli.Usagef("--loop-threshold %d: want 2 or more conflicts (one conflict is no loop)", r.LoopThreshold)
	}
	if r.LoopGap <= 0 {
		return nil, cli.Usagef("--loop-gap %s: want a positive duration", r.LoopGap)
	}
	if err := checkCluster(r.Cluster); err != nil {
		return nil, err
	}
	o := report.Options{Cluster: r.Cluster, Top: r.Top, Namespace: r.Namespace, Resource: r.Resource, User: r.User,
		LoopGap: r.LoopGap, LoopThreshold: r.LoopThreshold, Until: now}
	var err error
	if o.Since, err = cli.ParseTime(r.Since, now); err != nil {
		return nil, cli.Usagef("--since: %w", err)
	}
	if r.Until != "" {
		if o.Until, err = cli.ParseTime(r.Until, now); err != nil {
			return nil, cli.Usagef("--until: %w", err)
		}
	}
	if !o.Since.Before(o.Until) {
		return nil, cli.Usagef("--since %s is not before --until %s: the window is empty", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	conn, err := r.Connect(w)
	if err != nil {
		return nil, err
	}
	o.Database = conn.Store.Database
	return &Report{Connection: conn, Options: o, JSON: r.Format == "json"}, nil
}

// ServeConfig is what `auditsink serve` reads from its flags and
// environment. Register binds it to a flag set; Resolve turns it into the
// sink.Options of sink.Run.
type ServeConfig struct {
	WriteConfig
	// Options receives the flags that need no resolving (--listen,
	// --tls-cert, ...), with the Default* values.
	Options sink.Options
	// TokenFile is --token-file; empty: the token is $AUDITSINK_TOKEN.
	TokenFile string
	// TokenClusters is --token-clusters, the clusters the token may
	// write (comma-separated); empty: any.
	TokenClusters string
	// ClientNames is --client-names, the allow-list of client
	// certificate names: name or name=cluster entries, comma-separated
	// (ParseClientNames); required with --client-ca.
	ClientNames string
	// NoMigrate is --no-migrate: never run DDL; wait for a schema that
	// `auditsink migrate` brought to this binary's version.
	NoMigrate bool
	// SpoolMax is --spool-max (a size, ParseBytes); DefaultSpoolMax.
	SpoolMax string
	// MaxBody is --max-body (a size); DefaultMaxBody.
	MaxBody string
	// Retention is --retention (ParseRetention); empty keeps all.
	Retention string
	// MemoryLimit is --memory-limit; DefaultServeMemoryLimit.
	MemoryLimit string
	// GCPercent is --gc-percent; DefaultGCPercent.
	GCPercent int
	// CPUProfile is --cpu-profile; empty writes none.
	CPUProfile string
}

// Register binds s to the flags of serve, the shared ones included.
func (s *ServeConfig) Register(fs *flag.FlagSet) {
	s.WriteConfig.Register(fs)
	o := &s.Options
	fs.StringVar(&o.Listen, "listen", sink.DefaultListen, "`address` to serve on")
	fs.StringVar(&o.TLSCertFile, "tls-cert", "", "TLS certificate `file` (PEM); give it and --tls-key, or --plaintext")
	fs.StringVar(&o.TLSKeyFile, "tls-key", "", "TLS private key `file` (PEM)")
	fs.BoolVar(&o.Plaintext, "plaintext", false, "serve plain HTTP without TLS (tests and trusted sidecars only)")
	fs.StringVar(&o.ClientCAFile, "client-ca", "", "CA bundle `file` that verifies the apiserver's client certificate (reloaded on change; needs --client-names)")
	fs.StringVar(&s.ClientNames, "client-names", "", "allow-list of client certificate `names` (Common Name or DNS name), comma-separated; name=cluster binds a name to the clusters it may write (repeat the name for more), a bare name may write any")
	fs.StringVar(&s.TokenFile, "token-file", "", "`file` holding the bearer token the apiserver sends (beats $"+TokenEnv+"), at least "+strconv.Itoa(MinTokenLength)+" characters")
	fs.StringVar(&s.TokenClusters, "token-clusters", "", "`clusters` the token may write, comma-separated (empty: any)")
	fs.BoolVar(&s.NoMigrate, "no-migrate", false, "run no DDL: wait until `auditsink migrate` has brought the schema to this version (for a ClickHouse user without DDL rights); retention then belongs to `migrate --retention` too")
	fs.BoolVar(&o.AllowUnauthenticated, "allow-unauthenticated", false, "accept batches without credentials")
	fs.StringVar(&o.MetricsListen, "metrics-listen", DefaultMetricsListen, "`address` of the plain-HTTP /metrics endpoint (empty: off)")
	fs.StringVar(&o.SpoolDir, "spool-dir", DefaultSpoolDir, "durable spool `directory`")
	fs.StringVar(&s.SpoolMax, "spool-max", DefaultSpoolMax, "spool `size` at which the sink answers 503")
	fs.StringVar(&s.MaxBody, "max-body", DefaultMaxBody, "largest request body `size` (413 above)")
	fs.IntVar(&o.MaxEventBytes, "max-event-bytes", audit.DefaultMaxEventBytes, "largest event in `bytes`; larger ones are dead-lettered")
	fs.StringVar(&s.Retention, "retention", "", "drop day partitions older than this `age`, e.g. 30d (empty: keep all)")
	fs.IntVar(&o.InsertParallel, "insert-parallel", DefaultInsertParallel, "ClickHouse inserts in flight, 1 or more")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", sink.DefaultShutdownTimeout, "bound of a graceful shutdown (keep it below the pod's terminationGracePeriodSeconds)")
	fs.StringVar(&s.MemoryLimit, "memory-limit", DefaultServeMemoryLimit, "soft memory `limit` of the Go runtime (GOMEMLIMIT beats it); the GC works harder near it")
	fs.IntVar(&s.GCPercent, "gc-percent", DefaultGCPercent, "Go GC target `percentage` (GOGC beats it): higher trades memory, capped by --memory-limit, for less GC CPU")
	fs.StringVar(&s.CPUProfile, "cpu-profile", "", "write a Go CPU profile (pprof) of the whole run to this `file` (diagnostics)")
}

// Serve is a validated ServeConfig.
type Serve struct {
	Options     sink.Options
	MemoryLimit int64
	GCPercent   int
	CPUProfile  string
}

// Resolve validates s and turns it into the sink.Options of sink.Run, logging on
// w: the store (see Config.Connect), the sizes, the retention, the token
// (the file first, then $AUDITSINK_TOKEN), the cluster, stages and
// redactions.
func (s *ServeConfig) Resolve(w io.Writer) (*Serve, error) {
	o := s.Options
	var err error
	if o.SpoolMaxBytes, err = ParseBytes(s.SpoolMax); err != nil {
		return nil, cli.Usagef("--spool-max: %w", err)
	}
	if o.MaxBodyBytes, err = ParseBytes(s.MaxBody); err != nil {
		return nil, cli.Usagef("--max-body: %w", err)
	}
	if o.Retention, err = ParseRetention(s.Retention); err != nil {
		return nil, err
	}
	mem, err := memoryLimit(s.MemoryLimit)
	if err != nil {
		return nil, err
	}
	for _, v := range []struct {
		flag string
		n    int64
	}{{"--insert-parallel", int64(o.InsertParallel)}, {"--max-event-bytes", int64(o.MaxEventBytes)}, {"--gc-percent", int64(s.GCPercent)}} {
		if v.n < 1 {
			return nil, cli.Usagef("%s %d: want 1 or more", v.flag, v.n)
		}
	}
	if o.ShutdownTimeout <= 0 {
		return nil, cli.Usagef("--shutdown-timeout %s: want a positive duration", o.ShutdownTimeout)
	}
	if o.Listen == "" {
		return nil, cli.Usagef("--listen is empty: give an address such as %s", sink.DefaultListen)
	}
	if o.SpoolDir == "" {
		return nil, cli.Usagef("--spool-dir is empty: the sink acknowledges a batch only once it is in the spool")
	}
	if err := s.checkTLS(); err != nil {
		return nil, err
	}
	if o.Token, err = readToken(s.TokenFile); err != nil {
		return nil, cli.Usagef("--token-file: %w", err)
	}
	if err := s.checkAuth(o); err != nil {
		return nil, err
	}
	if o.Token == "" && o.ClientCAFile == "" && !o.AllowUnauthenticated {
		return nil, cli.Usagef("no authentication configured: give --token-file (or $%s), --client-ca, or --allow-unauthenticated", TokenEnv)
	}
	o.TokenClusters = SplitList(s.TokenClusters)
	if o.ClientNames, err = ParseClientNames(s.ClientNames); err != nil {
		return nil, cli.Usagef("--client-names: %w", err)
	}
	if s.NoMigrate && o.Retention > 0 {
		return nil, cli.Usagef("--retention: drops partitions, which is DDL; with --no-migrate run `auditsink migrate --retention` as a job instead")
	}
	o.NoMigrate = s.NoMigrate
	conn, err := s.Connect(w)
	if err != nil {
		return nil, err
	}
	o.Store = conn.Store
	o.Cluster = s.Cluster
	o.Stages = SplitList(s.Stages)
	o.RedactResources = SplitList(s.RedactResources)
	o.Logger = conn.Logger
	return &Serve{Options: o, MemoryLimit: mem, GCPercent: s.GCPercent, CPUProfile: s.CPUProfile}, nil
}

// checkTLS refuses what serverTLS would refuse, naming the flags.
func (s *ServeConfig) checkTLS() error {
	o := s.Options
	if o.Plaintext {
		if o.TLSCertFile != "" || o.TLSKeyFile != "" {
			return cli.Usagef("give --tls-cert and --tls-key, or --plaintext, not both")
		}
		if o.ClientCAFile != "" {
			return cli.Usagef("--client-ca needs TLS: drop --plaintext and give --tls-cert and --tls-key")
		}
		return nil
	}
	if o.TLSCertFile == "" || o.TLSKeyFile == "" {
		return cli.Usagef("TLS needs --tls-cert and --tls-key (or --plaintext for plain HTTP)")
	}
	for _, f := range []struct{ flag, path string }{{"--tls-cert", o.TLSCertFile}, {"--tls-key", o.TLSKeyFile}, {"--client-ca", o.ClientCAFile}} {
		if f.path == "" {
			continue
		}
		if err := checkReadable(f.path); err != nil {
			return cli.Usagef("%s: %w", f.flag, err)
		}
	}
	return nil
}

// MinTokenLength is the shortest bearer token serve accepts: a token
// guards every write to the sink, and the chart generates 48 characters.
const MinTokenLength = 32

// checkAuth refuses credentials that contradict each other or are too
// weak, naming the flag.
func (s *ServeConfig) checkAuth(o sink.Options) error {
	tokenFlag := "--token-file"
	if s.TokenFile == "" {
		tokenFlag = "$" + TokenEnv
	}
	switch {
	case o.AllowUnauthenticated && (o.Token != "" || o.ClientCAFile != ""):
		return cli.Usagef("--allow-unauthenticated: contradicts the token or --client-ca, which would be ignored: drop one")
	case o.Token != "" && len(o.Token) < MinTokenLength:
		return cli.Usagef("%s: the token has %d characters, want at least %d (e.g. openssl rand -hex 24)", tokenFlag, len(o.Token), MinTokenLength)
	case o.Token == "" && s.TokenClusters != "":
		return cli.Usagef("--token-clusters: needs a token (--token-file or $%s)", TokenEnv)
	case o.ClientCAFile != "" && s.ClientNames == "":
		return cli.Usagef("--client-ca: needs --client-names; a CA such as the cluster CA also signs kubelet and user certificates")
	case o.ClientCAFile == "" && s.ClientNames != "":
		return cli.Usagef("--client-names: needs --client-ca")
	}
	return nil
}

// ParseClientNames reads --client-names: comma-separated entries, each a
// certificate name (Common Name or DNS name), which may then write any
// cluster, or name=cluster, which binds the name to that cluster (an entry
// per cluster). A name may not be both bound and unbound.
func ParseClientNames(s string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, e := range SplitList(s) {
		name, cluster, bound := strings.Cut(e, "=")
		name, cluster = strings.TrimSpace(name), strings.TrimSpace(cluster)
		if name == "" {
			return nil, fmt.Errorf("entry %q has no name", e)
		}
		clusters, seen := out[name]
		switch {
		case !bound && seen && len(clusters) > 0, bound && seen && len(clusters) == 0:
			return nil, fmt.Errorf("%q is both bound to clusters and allowed every cluster", name)
		case bound && !sink.IsClusterName(cluster):
			return nil, fmt.Errorf("entry %q: invalid cluster name %q", e, cluster)
		case bound:
			out[name] = append(clusters, cluster)
		default:
			out[name] = nil
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// readToken reads the bearer token from file, or from $AUDITSINK_TOKEN
// when file is empty; surrounding white space (a trailing newline) is
// dropped from both.
func readToken(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(TokenEnv)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// memoryLimit parses --memory-limit; 0 when GOMEMLIMIT is set (it wins)
// or the flag is empty.
func memoryLimit(s string) (int64, error) {
	if s == "" || os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	n, err := ParseBytes(s)
	if err != nil {
		return 0, cli.Usagef("--memory-limit: %w", err)
	}
	return n, nil
}

// SplitList splits a comma-separated list, trimming spaces and dropping
// empty entries.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// ParseRetention reads "30d" (days) or a Go duration; "" is 0 (keep all).
// Its errors name --retention and are usage errors.
func ParseRetention(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 {
			return 0, cli.Usagef("--retention %q: want a number of days such as 30d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, cli.Usagef("--retention %q: want 30d or a duration", s)
	}
	return d, nil
}

// ParseBytes reads sizes such as 512MiB, 1GiB or a plain byte count.
func ParseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}
	orig, mult := s, int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("size " + strconv.Quote(orig) + ": want a positive number with an optional KiB, MiB, GiB or TiB")
	}
	return n * mult, nil
}
