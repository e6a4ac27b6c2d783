// Command auditsink stores kube-apiserver audit events in ClickHouse.
//
//	auditsink serve          HTTPS endpoint for the apiserver's audit webhook backend
//	auditsink ingest FILE... store JSON-lines audit log files (plain or .gz)
//	auditsink tail PATH      follow a live audit log across rotation
//	auditsink migrate        create or upgrade the ClickHouse schema
//	auditsink report         conflict analytics: retry loops, hot objects, stampless writes, ...
//	auditsink report FILE... the same, straight from audit log files (ClickHouse's engine in process)
//	auditsink suggest FILE... ConcurrencyPolicy drafts from the history, replayed over the same files
//
// Each subcommand binds its flags to an options struct of analytics/config,
// which validates them before anything is touched (exit 2 when they are
// wrong), then runs (exit 1 when that fails); see internal/cli and
// docs/auditsink.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/stampguard/stampguard/analytics/config"
	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/sink"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// work is what a subcommand does once its command line is validated.
type work func(ctx context.Context) error

// command is one subcommand: bind registers its flags on fs and returns
// prepare, which validates the flags and operands, touching nothing, and
// returns the work.
type command struct {
	name, operands, summary string
	maxOperands             int // -1: any number
	bind                    func(fs *flag.FlagSet, stdout, stderr io.Writer) (prepare func(operands []string) (work, error))
}

var commands = []command{
	{"serve", "", "HTTPS endpoint for the kube-apiserver audit webhook backend", 0, serve},
	{"ingest", "FILE...", "store JSON-lines audit log files (plain or .gz)", -1, ingest},
	{"tail", "PATH", "follow a live audit log across rotation", 1, tail},
	{"migrate", "", "create or upgrade the ClickHouse schema", 0, migrate},
	{"report", "[FILE...]", "conflict analytics over a time window (table or JSON), from ClickHouse or straight from audit log files", -1, reportCmd},
	{"suggest", "[FILE...]", "ConcurrencyPolicy drafts (Audit mode) from the history, each replayed over the same audit logs", -1, suggestCmd},
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: auditsink <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-8s %s", c.name, c.summary)
		if c.operands != "" {
			fmt.Fprintf(&b, ": auditsink %s [flags] %s", c.name, c.operands)
		}
		b.WriteString("\n")
	}
	b.WriteString("\nRun 'auditsink <command> -h' for the flags of a command.\n" +
		"Exit codes: 0 done, 2 a bad command line (nothing was done), 1 a failure while running.\n")
	return b.String()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return cli.ExitUsage
	}
	if cli.IsHelp(args[0]) {
		if len(args) > 1 && !cli.IsHelp(args[1]) { // auditsink help report
			args = []string{args[1], "-h"}
		} else {
			fmt.Fprint(stdout, usage())
			return cli.ExitOK
		}
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "auditsink: unknown command %q\n\n%s", args[0], usage())
		return cli.ExitUsage
	}
	name := "auditsink " + cmd.name
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	cli.SetUsage(fs, strings.TrimSpace(name+" [flags] "+cmd.operands))
	prepare := cmd.bind(fs, stdout, stderr)
	err := func() error {
		operands, err := cli.Parse(fs, args[1:], cmd.maxOperands, stdout)
		if err != nil {
			return err
		}
		w, err := prepare(operands)
		if err != nil {
			return cli.Usage(err) // nothing has been done yet
		}
		return w(ctx)
	}()
	code := cli.ExitCode(err)
	if code != cli.ExitOK {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		if code == cli.ExitUsage {
			fmt.Fprintf(stderr, "Run '%s -h' for its flags.\n", name)
		}
	}
	return code
}

func serve(fs *flag.FlagSet, _, stderr io.Writer) func([]string) (work, error) {
	var c config.ServeConfig
	c.Register(fs)
	return func([]string) (work, error) {
		s, err := c.Resolve(stderr)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			if s.MemoryLimit > 0 {
				debug.SetMemoryLimit(s.MemoryLimit)
			}
			if os.Getenv("GOGC") == "" {
				debug.SetGCPercent(s.GCPercent)
			}
			if s.CPUProfile != "" {
				stop, err := cli.StartCPUProfile(s.CPUProfile)
				if err != nil {
					return err
				}
				defer func() {
					if err := stop(); err != nil {
						s.Options.Logger.Error("write CPU profile", "err", err)
					}
				}()
			}
			// The certificate watcher (controller-runtime's) logs through
			// its global logger.
			ctrllog.SetLogger(logr.FromSlogHandler(s.Options.Logger.Handler()))
			return sink.Run(ctx, s.Options)
		}, nil
	}
}

func ingest(fs *flag.FlagSet, stdout, stderr io.Writer) func([]string) (work, error) {
	var c config.IngestConfig
	c.Register(fs)
	return func(files []string) (work, error) {
		in, err := c.Resolve(files, stderr)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			if in.MemoryLimit > 0 {
				debug.SetMemoryLimit(in.MemoryLimit)
			}
			st, err := in.OpenMigrated(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			res, err := pipeline.IngestFiles(ctx, st, in.Files, in.Options)
			fmt.Fprintln(stdout, res)
			return err
		}, nil
	}
}

func tail(fs *flag.FlagSet, _, stderr io.Writer) func([]string) (work, error) {
	var c config.TailConfig
	c.Register(fs)
	return func(operands []string) (work, error) {
		t, err := c.Resolve(operands, stderr)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			st, err := t.OpenMigrated(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			if t.MetricsListen != "" {
				reg := prometheus.NewRegistry()
				reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
				t.Options.Metrics = pipeline.NewMetrics(reg)
				defer sink.ServeMetrics(t.MetricsListen, reg, t.Logger)(context.WithoutCancel(ctx))
			}
			return pipeline.Tail(ctx, st, t.Path, t.Options)
		}, nil
	}
}

func migrate(fs *flag.FlagSet, stdout, stderr io.Writer) func([]string) (work, error) {
	var c config.MigrateConfig
	c.Register(fs)
	return func([]string) (work, error) {
		m, err := c.Resolve(stderr)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			st, err := m.Open(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			applied, err := st.Migrate(ctx)
			if err != nil {
				return m.Err(err)
			}
			v, err := st.SchemaVersion(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "database %s at schema version %d (applied now: %v)\n", st.Database(), v, applied)
			if m.Compact {
				res, err := st.Compact(ctx, time.Unix(0, 0), store.DefaultCompactAfter)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "hour caches built: %d hours, %d blocks of hours\n", len(res.Hours), len(res.Blocks))
				pruned, err := st.Prune(ctx, m.PruneAfter)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "superseded cache versions deleted: %d\n", pruned)
			}
			if m.Retention == 0 {
				return nil
			}
			dropped, err := st.DropPartitionsBefore(ctx, time.Now().Add(-m.Retention))
			fmt.Fprintf(stdout, "retention %s: dropped days %v\n", c.Retention, dropped)
			return err
		}, nil
	}
}
