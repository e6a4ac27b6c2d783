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
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

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
		if fe := (*sink.FlagError)(nil); errors.As(err, &fe) {
			fmt.Fprintf(stderr, "auditsink %s: %v\n", args[0], err)
			return 2
		}
		fmt.Fprintf(stderr, "auditsink %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

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
	var c sink.ServeConfig
	c.Register(fs)
	memLimit := fs.String("memory-limit", "240MiB", "soft memory limit of the Go runtime (GOMEMLIMIT); the GC works harder near it")
	gcPercent := fs.Int("gc-percent", 100, "Go GC target percentage (GOGC): higher trades memory, capped by --memory-limit, for less GC CPU")
	cpuProfile := fs.String("cpu-profile", "", "write a Go CPU profile (pprof) of the whole run to this file (diagnostics)")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := c.Logger(stderr)
	if err != nil {
		return err
	}
	o, err := c.Resolve(log)
	if err != nil {
		return err
	}
	// The certificate watcher (controller-runtime's) logs through its
	// global logger.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	if err := setMemoryLimit(*memLimit); err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}
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
	n, err := sink.ParseBytes(limit)
	if err != nil {
		return fmt.Errorf("--memory-limit: %w", err)
	}
	debug.SetMemoryLimit(n)
	return nil
}

func ingest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c sink.Config
	c.Register(fs)
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
	log, err := c.Logger(stderr)
	if err != nil {
		return err
	}
	st, err := c.OpenMigrated(ctx, log)
	if err != nil {
		return err
	}
	defer st.Close()
	o := c.IngestOptions(log)
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
	var c sink.Config
	c.Register(fs)
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
	log, err := c.Logger(stderr)
	if err != nil {
		return err
	}
	st, err := c.OpenMigrated(ctx, log)
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
	return analytics.Tail(ctx, st, path, c.TailOptions(*checkpoint, metrics, log))
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c sink.Config
	c.Register(fs)
	retention := fs.String("retention", "", "also drop day partitions older than this, e.g. 30d")
	compact := fs.Bool("compact", true, "build the hour caches of every closed hour, of any day, that needs it (the figures are the same without; reports are faster)")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := c.Logger(stderr)
	if err != nil {
		return err
	}
	st, err := c.Open(ctx, log)
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
	if *compact {
		res, err := st.Compact(ctx, time.Unix(0, 0), analytics.DefaultCompactAfter)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "hour caches built: %d hours\n", len(res.Hours))
	}
	keep, err := sink.ParseRetention(*retention)
	if err != nil || keep == 0 {
		return err
	}
	dropped, err := st.DropPartitionsBefore(ctx, time.Now().Add(-keep))
	fmt.Fprintf(stdout, "retention %s: dropped days %v\n", *retention, dropped)
	return err
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
