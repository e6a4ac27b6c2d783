package sink

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/audit"
)

// The environment variables the auditsink commands read.
const (
	// DSNEnv holds the ClickHouse DSN when no DSN file is given; it beats
	// the --clickhouse flag.
	DSNEnv = "AUDITSINK_CLICKHOUSE_DSN"
	// ClickHouseClusterEnv is the default of --clickhouse-cluster.
	ClickHouseClusterEnv = "AUDITSINK_CLICKHOUSE_CLUSTER"
	// TokenEnv holds the bearer token of serve when no token file is
	// given.
	TokenEnv = "AUDITSINK_TOKEN"
)

// Config is what every auditsink command (serve, ingest, tail, migrate,
// report) reads from its flags and environment: where ClickHouse is, what
// to store and how to log. Register binds it to a flag set; the methods
// resolve it into the library's options. The defaults are those Register
// sets.
type Config struct {
	// DSN is --clickhouse, the ClickHouse native DSN; no default. It is
	// the last choice: DSNFile, then $AUDITSINK_CLICKHOUSE_DSN, come first.
	DSN string
	// DSNFile is --clickhouse-dsn-file, a file holding the DSN; no default.
	DSNFile string
	// Database is --database; defaulted to "stampguard".
	Database string
	// ClickHouseCluster is --clickhouse-cluster; defaulted to
	// $AUDITSINK_CLICKHOUSE_CLUSTER (empty: one server).
	ClickHouseCluster string
	// LogLevel is --log-level (debug, info, warn, error); defaulted to
	// "info".
	LogLevel string
	// Cluster is --cluster, the source cluster stored with each event;
	// empty means DefaultCluster.
	Cluster string
	// Stages is --stages, a comma-separated list; defaulted to
	// audit.DefaultStages.
	Stages string
	// RedactResources is --redact-resources, a comma-separated list; no
	// default (secrets are always redacted).
	RedactResources string
	// KeepRaw is --keep-raw; off by default.
	KeepRaw bool
}

// Register binds c to the flags every command shares, with their
// defaults.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.DSN, "clickhouse", "", "ClickHouse native DSN, e.g. clickhouse://127.0.0.1:9000. Credentials belong in --clickhouse-dsn-file or $"+DSNEnv+", not in argv")
	fs.StringVar(&c.DSNFile, "clickhouse-dsn-file", "", "file holding the ClickHouse DSN (with user, password, secure=true)")
	fs.StringVar(&c.Database, "database", "stampguard", "ClickHouse database")
	fs.StringVar(&c.ClickHouseCluster, "clickhouse-cluster", os.Getenv(ClickHouseClusterEnv), "ClickHouse cluster (from the servers' remote_servers) for sharded, replicated storage; empty: one server (or $"+ClickHouseClusterEnv+")")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.Cluster, "cluster", "", "source cluster name stored with each event")
	fs.StringVar(&c.Stages, "stages", strings.Join(audit.DefaultStages, ","), "audit stages to store")
	fs.StringVar(&c.RedactResources, "redact-resources", "", "comma-separated resources whose request and response objects are dropped like those of secrets (always dropped)")
	fs.BoolVar(&c.KeepRaw, "keep-raw", false, "store each event's raw JSON (secrets redacted) in events.raw")
}

// Logger is a JSON logger on w at LogLevel.
func (c *Config) Logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

// StoreOptions resolves the DSN: the file first, then
// $AUDITSINK_CLICKHOUSE_DSN, then the flag (with a warning on log when
// the flag's DSN holds a password, which the process list shows).
func (c *Config) StoreOptions(log *slog.Logger) (analytics.StoreOptions, error) {
	dsn := c.DSN
	switch {
	case c.DSNFile != "":
		b, err := os.ReadFile(c.DSNFile)
		if err != nil {
			return analytics.StoreOptions{}, fmt.Errorf("read DSN file: %w", err)
		}
		dsn = strings.TrimSpace(string(b))
	case os.Getenv(DSNEnv) != "":
		dsn = os.Getenv(DSNEnv)
	case dsn == "":
		return analytics.StoreOptions{}, fmt.Errorf("no ClickHouse DSN: give --clickhouse-dsn-file, $%s or --clickhouse", DSNEnv)
	default:
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			if _, hasPassword := u.User.Password(); hasPassword {
				log.Warn("the ClickHouse DSN on the command line holds a password that other users can read in the process list; use --clickhouse-dsn-file or $" + DSNEnv)
			}
		}
	}
	return analytics.StoreOptions{DSN: dsn, Database: c.Database, KeepRaw: c.KeepRaw, ClickHouseCluster: c.ClickHouseCluster}, nil
}

// Open connects to the store c names.
func (c *Config) Open(ctx context.Context, log *slog.Logger) (*analytics.Store, error) {
	so, err := c.StoreOptions(log)
	if err != nil {
		return nil, err
	}
	return analytics.OpenStore(ctx, so)
}

// OpenMigrated connects to the store c names and applies the migrations.
func (c *Config) OpenMigrated(ctx context.Context, log *slog.Logger) (*analytics.Store, error) {
	st, err := c.Open(ctx, log)
	if err != nil {
		return nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// SourceCluster is Cluster, or DefaultCluster (what POST /events uses)
// when it is empty.
func (c *Config) SourceCluster() string {
	if c.Cluster == "" {
		return DefaultCluster
	}
	return c.Cluster
}

// Accepter decodes and filters events as c says.
func (c *Config) Accepter() *analytics.Accepter {
	return newAccepter(SplitList(c.Stages), SplitList(c.RedactResources), c.KeepRaw)
}

func newAccepter(stages, redact []string, keepRaw bool) *analytics.Accepter {
	return &analytics.Accepter{
		Decoder: audit.Decoder{RedactResources: redact, KeepRaw: keepRaw},
		Stages:  stages,
	}
}

// IngestOptions are the options of `auditsink ingest` (without a progress
// writer).
func (c *Config) IngestOptions(log *slog.Logger) analytics.IngestOptions {
	return analytics.IngestOptions{Cluster: c.SourceCluster(), Accepter: c.Accepter(), Logger: log}
}

// TailOptions are the options of `auditsink tail` with this checkpoint
// file and metrics (nil: none).
func (c *Config) TailOptions(checkpoint string, m *analytics.Metrics, log *slog.Logger) analytics.TailOptions {
	return analytics.TailOptions{Cluster: c.SourceCluster(), Accepter: c.Accepter(), CheckpointPath: checkpoint, Metrics: m, Logger: log}
}

// ServeConfig is what `auditsink serve` reads from its flags and
// environment. Register binds it to a flag set; Resolve turns it into the
// Options of Run.
type ServeConfig struct {
	Config
	// Options receives the flags that need no resolving (--listen,
	// --tls-cert, ...), with Register's defaults.
	Options Options
	// TokenFile is --token-file; empty: the token is $AUDITSINK_TOKEN.
	TokenFile string
	// SpoolMax is --spool-max (a size, ParseBytes); defaulted to "1GiB".
	SpoolMax string
	// MaxBody is --max-body (a size); defaulted to "1GiB".
	MaxBody string
	// Retention is --retention (ParseRetention); empty keeps all.
	Retention string
}

// Register binds s to the flags of serve, the shared ones included.
func (s *ServeConfig) Register(fs *flag.FlagSet) {
	s.Config.Register(fs)
	o := &s.Options
	fs.StringVar(&o.Listen, "listen", ":8443", "address to serve on")
	fs.StringVar(&o.TLSCertFile, "tls-cert", "", "TLS certificate (PEM)")
	fs.StringVar(&o.TLSKeyFile, "tls-key", "", "TLS private key (PEM)")
	fs.BoolVar(&o.Plaintext, "plaintext", false, "serve plain HTTP without TLS (tests and trusted sidecars only)")
	fs.StringVar(&o.ClientCAFile, "client-ca", "", "CA bundle that verifies the apiserver's client certificate")
	fs.StringVar(&s.TokenFile, "token-file", "", "file holding the bearer token the apiserver sends (or $"+TokenEnv+")")
	fs.BoolVar(&o.AllowUnauthenticated, "allow-unauthenticated", false, "accept batches without credentials")
	fs.StringVar(&o.MetricsListen, "metrics-listen", ":9090", "address of the plain-HTTP /metrics endpoint (empty: off)")
	fs.StringVar(&o.SpoolDir, "spool-dir", "/var/lib/auditsink/spool", "durable spool directory")
	fs.StringVar(&s.SpoolMax, "spool-max", "1GiB", "spool size at which the sink answers 503")
	fs.StringVar(&s.MaxBody, "max-body", "1GiB", "largest request body (413 above)")
	fs.IntVar(&o.MaxEventBytes, "max-event-bytes", audit.DefaultMaxEventBytes, "largest event; larger ones are dead-lettered")
	fs.StringVar(&s.Retention, "retention", "", "drop day partitions older than this, e.g. 30d (empty: keep all)")
	fs.IntVar(&o.InsertParallel, "insert-parallel", 2, "ClickHouse inserts in flight")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout, "bound of a graceful shutdown (keep it below the pod's terminationGracePeriodSeconds)")
}

// Resolve turns s into the Options of Run, logging on log: the store (see
// Config.StoreOptions), the sizes, the retention, the token (the file
// first, then $AUDITSINK_TOKEN), the cluster, stages and redactions.
func (s *ServeConfig) Resolve(log *slog.Logger) (Options, error) {
	o := s.Options
	var err error
	if o.Store, err = s.StoreOptions(log); err != nil {
		return Options{}, err
	}
	if o.SpoolMaxBytes, err = ParseBytes(s.SpoolMax); err != nil {
		return Options{}, fmt.Errorf("--spool-max: %w", err)
	}
	if o.MaxBodyBytes, err = ParseBytes(s.MaxBody); err != nil {
		return Options{}, fmt.Errorf("--max-body: %w", err)
	}
	if o.Retention, err = ParseRetention(s.Retention); err != nil {
		return Options{}, err
	}
	if o.Token, err = readToken(s.TokenFile); err != nil {
		return Options{}, err
	}
	o.Cluster = s.SourceCluster()
	o.Stages = SplitList(s.Stages)
	o.RedactResources = SplitList(s.RedactResources)
	o.Logger = log
	return o, nil
}

// readToken reads the bearer token from file, or from $AUDITSINK_TOKEN
// when file is empty.
func readToken(file string) (string, error) {
	if file == "" {
		return os.Getenv(TokenEnv), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
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
func ParseRetention(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("--retention %q: want a number of days such as 30d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--retention %q: want 30d or a duration", s)
	}
	return d, nil
}

// ParseBytes reads sizes such as 512MiB, 1GiB or a plain byte count.
func ParseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional KiB, MiB, GiB or TiB", s)
	}
	return n * mult, nil
}
