// Command auditsink stores kube-apiserver audit events in ClickHouse.
//
//	auditsink serve   HTTPS endpoint for the apiserver's audit webhook backend
//	auditsink ingest  store JSON-lines audit log files (plain or .gz)
//	auditsink tail    follow a live audit log across rotation
//	auditsink migrate create or upgrade the ClickHouse schema
//	auditsink report  conflict analytics: retry loops, hot objects, stampless writes, ...
//
// Each subcommand parses its flags into an options struct and calls the
// library; see docs/auditsink.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/sink"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: auditsink <command> [flags]

commands:
  serve    HTTPS endpoint for the kube-apiserver audit webhook backend
  ingest   store JSON-lines audit log files (plain or .gz): auditsink ingest FILE...
  tail     follow a live audit log across rotation: auditsink tail PATH
  migrate  create or upgrade the ClickHouse schema
  report   conflict analytics over a time window (table or JSON)

Run 'auditsink <command> -h' for the flags of a command.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"serve": serve, "ingest": ingest, "tail": tail, "migrate": migrate, "report": reportCmd,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "auditsink: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err := cmd(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		fmt.Fprintf(stderr, "auditsink %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

// common are the flags every subcommand shares.
type common struct {
	dsn, dsnFile, database, logLevel string
	cluster, stages, redact          string
	keepRaw                          bool
}

const dsnEnv = "AUDITSINK_CLICKHOUSE_DSN"

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "clickhouse", "", "ClickHouse native DSN, e.g. clickhouse://127.0.0.1:9000. Credentials belong in --clickhouse-dsn-file or $"+dsnEnv+", not in argv")
	fs.StringVar(&c.dsnFile, "clickhouse-dsn-file", "", "file holding the ClickHouse DSN (with user, password, secure=true)")
	fs.StringVar(&c.database, "database", "stampguard", "ClickHouse database")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.cluster, "cluster", "", "source cluster name stored with each event")
	fs.StringVar(&c.stages, "stages", strings.Join(analytics.DefaultStages, ","), "audit stages to store")
	fs.StringVar(&c.redact, "redact-resources", "", "comma-separated resources whose request and response objects are dropped like those of secrets (always dropped)")
	fs.BoolVar(&c.keepRaw, "keep-raw", false, "store each event's raw JSON (secrets redacted) in events.raw")
}

func (c *common) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

// storeOptions resolves the DSN: a file first, then the environment, then
// the flag.
func (c *common) storeOptions(log *slog.Logger) (analytics.StoreOptions, error) {
	dsn := c.dsn
	switch {
	case c.dsnFile != "":
		b, err := os.ReadFile(c.dsnFile)
		if err != nil {
			return analytics.StoreOptions{}, fmt.Errorf("read DSN file: %w", err)
		}
		dsn = strings.TrimSpace(string(b))
	case os.Getenv(dsnEnv) != "":
		dsn = os.Getenv(dsnEnv)
	case dsn == "":
		return analytics.StoreOptions{}, fmt.Errorf("no ClickHouse DSN: give --clickhouse-dsn-file, $%s or --clickhouse", dsnEnv)
	default:
		if strings.Contains(strings.SplitN(dsn, "@", 2)[0], ":") && strings.Contains(dsn, "@") {
			log.Warn("the ClickHouse DSN on the command line holds a password that other users can read in the process list; use --clickhouse-dsn-file or $" + dsnEnv)
		}
	}
	return analytics.StoreOptions{DSN: dsn, Database: c.database, KeepRaw: c.keepRaw}, nil
}

func (c *common) accepter() *analytics.Accepter {
	return &analytics.Accepter{
		Decoder: analytics.Decoder{RedactResources: splitList(c.redact), KeepRaw: c.keepRaw},
		Stages:  splitList(c.stages),
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}

func serve(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	var (
		o                   sink.Options
		tokenFile           string
		retention, spoolMax string
		maxBody             string
	)
	fs.StringVar(&o.Listen, "listen", ":8443", "address to serve on")
	fs.StringVar(&o.TLSCertFile, "tls-cert", "", "TLS certificate (PEM)")
	fs.StringVar(&o.TLSKeyFile, "tls-key", "", "TLS private key (PEM)")
	fs.BoolVar(&o.Plaintext, "plaintext", false, "serve plain HTTP without TLS (tests and trusted sidecars only)")
	fs.StringVar(&o.ClientCAFile, "client-ca", "", "CA bundle that verifies the apiserver's client certificate")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the bearer token the apiserver sends (or $AUDITSINK_TOKEN)")
	fs.BoolVar(&o.AllowUnauthenticated, "allow-unauthenticated", false, "accept batches without credentials")
	fs.StringVar(&o.MetricsListen, "metrics-listen", ":9090", "address of the plain-HTTP /metrics endpoint (empty: off)")
	fs.StringVar(&o.SpoolDir, "spool-dir", "/var/lib/auditsink/spool", "durable spool directory")
	fs.StringVar(&spoolMax, "spool-max", "1GiB", "spool size at which the sink answers 503")
	fs.StringVar(&maxBody, "max-body", "1GiB", "largest request body (413 above)")
	fs.IntVar(&o.MaxEventBytes, "max-event-bytes", analytics.DefaultMaxEventBytes, "largest event; larger ones are dead-lettered")
	fs.StringVar(&retention, "retention", "", "drop day partitions older than this, e.g. 30d (empty: keep all)")
	fs.IntVar(&o.InsertParallel, "insert-parallel", 2, "ClickHouse inserts in flight")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", sink.DefaultShutdownTimeout, "bound of a graceful shutdown (keep it below the pod's terminationGracePeriodSeconds)")
	memLimit := fs.String("memory-limit", "240MiB", "soft memory limit of the Go runtime (GOMEMLIMIT); the GC works harder near it")
	gcPercent := fs.Int("gc-percent", 100, "Go GC target percentage (GOGC): higher trades memory, capped by --memory-limit, for less GC CPU")
	cpuProfile := fs.String("cpu-profile", "", "write a Go CPU profile (pprof) of the whole run to this file (diagnostics)")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	if o.Store, err = c.storeOptions(log); err != nil {
		return err
	}
	if o.SpoolMaxBytes, err = parseBytes(spoolMax); err != nil {
		return fmt.Errorf("--spool-max: %w", err)
	}
	if o.MaxBodyBytes, err = parseBytes(maxBody); err != nil {
		return fmt.Errorf("--max-body: %w", err)
	}
	if o.Retention, err = parseRetention(retention); err != nil {
		return err
	}
	if err := setMemoryLimit(*memLimit); err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}
	switch {
	case tokenFile != "":
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("read token file: %w", err)
		}
		o.Token = strings.TrimSpace(string(b))
	default:
		o.Token = os.Getenv("AUDITSINK_TOKEN")
	}
	o.Cluster = clusterOr(c.cluster)
	o.Stages = splitList(c.stages)
	o.RedactResources = splitList(c.redact)
	o.Logger = log
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				log.Error("write CPU profile", "err", err)
			}
		}()
	}
	return sink.Run(ctx, o)
}

// setMemoryLimit applies --memory-limit unless GOMEMLIMIT is set.
func setMemoryLimit(limit string) error {
	if limit == "" || os.Getenv("GOMEMLIMIT") != "" {
		return nil
	}
	n, err := parseBytes(limit)
	if err != nil {
		return fmt.Errorf("--memory-limit: %w", err)
	}
	debug.SetMemoryLimit(n)
	return nil
}

func ingest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	noProgress := fs.Bool("no-progress", false, "no progress bar even on a terminal")
	memLimit := fs.String("memory-limit", "200MiB", "soft memory limit of the Go runtime (GOMEMLIMIT)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := setMemoryLimit(*memLimit); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: auditsink ingest [flags] FILE...")
		return errUsage
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	st, err := openMigrated(ctx, &c, log)
	if err != nil {
		return err
	}
	defer st.Close()
	o := analytics.IngestOptions{Cluster: clusterOr(c.cluster), Accepter: c.accepter(), Logger: log}
	if !*noProgress && isTerminal(os.Stderr) {
		o.Progress = stderr
	}
	res, err := analytics.IngestFiles(ctx, st, fs.Args(), o)
	fmt.Fprintln(stdout, res)
	return err
}

func tail(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	checkpoint := fs.String("checkpoint", "", "checkpoint file (default: PATH.auditsink-checkpoint)")
	metricsListen := fs.String("metrics-listen", "", "address of a plain-HTTP /metrics endpoint (empty: off)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: auditsink tail [flags] PATH")
		return errUsage
	}
	path := fs.Arg(0)
	if *checkpoint == "" {
		*checkpoint = path + ".auditsink-checkpoint"
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	st, err := openMigrated(ctx, &c, log)
	if err != nil {
		return err
	}
	defer st.Close()
	var metrics *analytics.Metrics
	if *metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		metrics = analytics.NewMetrics(reg)
		defer sink.ServeMetrics(*metricsListen, reg, log)(context.WithoutCancel(ctx))
	}
	return analytics.Tail(ctx, st, path, analytics.TailOptions{Cluster: clusterOr(c.cluster),
		Accepter: c.accepter(), CheckpointPath: *checkpoint, Metrics: metrics, Logger: log})
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	retention := fs.String("retention", "", "also drop day partitions older than this, e.g. 30d")
	scanDays := fs.Int("scan-days", 2, "record the events stored more than once (by writers killed mid-insert) of the last N days; 0: no scan")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	st, err := c.open(ctx, log)
	if err != nil {
		return err
	}
	defer st.Close()
	applied, err := st.Migrate(ctx)
	if err != nil {
		return err
	}
	v, err := st.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "database %s at schema version %d (applied now: %v)\n", st.Database(), v, applied)
	if *scanDays > 0 {
		if err := st.ScanDuplicates(ctx, time.Now().AddDate(0, 0, -*scanDays)); err != nil {
			return err
		}
	}
	keep, err := parseRetention(*retention)
	if err != nil || keep == 0 {
		return err
	}
	dropped, err := st.DropPartitionsBefore(ctx, time.Now().Add(-keep))
	fmt.Fprintf(stdout, "retention %s: dropped days %v\n", *retention, dropped)
	return err
}

// open connects to the store the flags name.
func (c *common) open(ctx context.Context, log *slog.Logger) (*analytics.Store, error) {
	so, err := c.storeOptions(log)
	if err != nil {
		return nil, err
	}
	return analytics.OpenStore(ctx, so)
}

func openMigrated(ctx context.Context, c *common, log *slog.Logger) (*analytics.Store, error) {
	st, err := c.open(ctx, log)
	if err != nil {
		return nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// clusterOr is c, or sink.DefaultCluster (what POST /events uses) when
// no --cluster was given.
func clusterOr(c string) string {
	if c == "" {
		return sink.DefaultCluster
	}
	return c
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// parseRetention reads "30d" (days) or a Go duration; "" is 0.
func parseRetention(s string) (time.Duration, error) {
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

// parseBytes reads sizes such as 512MiB, 1GiB or a plain byte count.
func parseBytes(s string) (int64, error) {
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
