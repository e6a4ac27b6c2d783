package sink

import (
	"context"
	"errors"
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
	fs.StringVar(&o.ClientCAFile, "client-ca", "", "CA bundle that verifies the apiserver's client certificate (reloaded on change; needs --client-names)")
	fs.StringVar(&s.ClientNames, "client-names", "", "allow-list of client certificate names (Common Name or DNS name), comma-separated; name=cluster binds a name to the clusters it may write (repeat the name for more), a bare name may write any")
	fs.StringVar(&s.TokenFile, "token-file", "", "file holding the bearer token the apiserver sends (or $"+TokenEnv+"), at least "+strconv.Itoa(MinTokenLength)+" characters")
	fs.StringVar(&s.TokenClusters, "token-clusters", "", "clusters the token may write, comma-separated (empty: any)")
	fs.BoolVar(&s.NoMigrate, "no-migrate", false, "run no DDL: wait until `auditsink migrate` has brought the schema to this version (for a ClickHouse user without DDL rights); retention then belongs to `migrate --retention` too")
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
	if err := s.checkAuth(o); err != nil {
		return Options{}, err
	}
	o.TokenClusters = SplitList(s.TokenClusters)
	if o.ClientNames, err = ParseClientNames(s.ClientNames); err != nil {
		return Options{}, &FlagError{Flag: "--client-names", Err: err}
	}
	if s.NoMigrate && o.Retention > 0 {
		return Options{}, &FlagError{Flag: "--retention", Err: errors.New("drops partitions, which is DDL: with --no-migrate run `auditsink migrate --retention` as a job instead")}
	}
	o.NoMigrate = s.NoMigrate
	o.Cluster = s.SourceCluster()
	o.Stages = SplitList(s.Stages)
	o.RedactResources = SplitList(s.RedactResources)
	o.Logger = log
	return o, nil
}

// MinTokenLength is the shortest bearer token serve accepts: a token
// guards every write to the sink, and the chart generates 48 characters.
const MinTokenLength = 32

// FlagError is a usage error: a flag's value, or a combination of flags,
// that cannot work. The command exits 2 with it.
type FlagError struct {
	Flag string // as the user gives it: --name, or $NAME for the environment
	Err  error
}

func (e *FlagError) Error() string { return e.Flag + ": " + e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// checkAuth refuses credentials that contradict each other or are too
// weak, naming the flag.
func (s *ServeConfig) checkAuth(o Options) error {
	tokenFlag := "--token-file"
	if s.TokenFile == "" {
		tokenFlag = "$" + TokenEnv
	}
	switch {
	case o.AllowUnauthenticated && (o.Token != "" || o.ClientCAFile != ""):
		return &FlagError{Flag: "--allow-unauthenticated", Err: errors.New("contradicts the token or --client-ca, which would be ignored: drop one")}
	case o.Token != "" && len(o.Token) < MinTokenLength:
		return &FlagError{Flag: tokenFlag, Err: fmt.Errorf("the token has %d characters, want at least %d (e.g. openssl rand -hex 24)", len(o.Token), MinTokenLength)}
	case o.Token == "" && s.TokenClusters != "":
		return &FlagError{Flag: "--token-clusters", Err: errors.New("needs a token (--token-file or $" + TokenEnv + ")")}
	case o.ClientCAFile != "" && s.ClientNames == "":
		return &FlagError{Flag: "--client-ca", Err: errors.New("needs --client-names: a CA such as the cluster CA also signs kubelet and user certificates")}
	case o.ClientCAFile == "" && s.ClientNames != "":
		return &FlagError{Flag: "--client-names", Err: errors.New("needs --client-ca")}
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
		case bound && !clusterName.MatchString(cluster):
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
