package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/sink"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/cli"
)

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
	fs.DurationVar(&o.LostUpdates.Every, "lost-updates-every", pipeline.DefaultLostUpdatesEvery, "how often to count the lost updates of the field history into the gauge auditsink_lost_updates (0: never; off with --no-field-history)")
	fs.DurationVar(&o.LostUpdates.Window, "lost-updates-window", pipeline.DefaultLostUpdatesWindow, "how far back each count of lost updates looks")
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
	if o.LostUpdates.Every < 0 {
		return nil, cli.Usagef("--lost-updates-every %s: want 0 (never) or a positive duration", o.LostUpdates.Every)
	}
	if o.LostUpdates.Window <= 0 {
		return nil, cli.Usagef("--lost-updates-window %s: want a positive duration", o.LostUpdates.Window)
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
	o.History = s.history
	if o.History == nil {
		o.LostUpdates.Every = 0 // no field history, no lost updates to count
	}
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
