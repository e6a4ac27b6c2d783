// Command demo is `make demo`: the whole stampguard story on one machine.
// It builds the binaries, starts on loopback etcd and kube-apiserver (audit
// logging to the audit sink and to a file), ClickHouse, the webhook and the
// audit sink as the built binaries, applies examples/demo-policies.yaml,
// runs a minute of contending writers (test/workload/contention), prints
// `auditsink report`, and keeps everything running until Ctrl-C.
//
// All state lives in one directory (.demo/run by default). A run first
// stops what a previous run left behind (by the pid files there) and wipes
// it; logs stay there after a run for reading.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/stampguard/stampguard/test/workload/contention"
)

func main() { os.Exit(run()) }

// options are the demo's flags.
type options struct {
	// dir holds bin/ (the built binaries) and run/ (everything a run
	// creates). Default .demo in the repository.
	dir string
	// duration of the workload. Default 1m.
	duration time.Duration
	// exit ends the demo after the report instead of waiting for Ctrl-C.
	exit bool
	// reportJSON, when set, receives `auditsink report --format json`.
	reportJSON string
	// policies are applied before the workload. Default examples/demo-policies.yaml.
	policies string
}

func run() int {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	var o options
	fs.StringVar(&o.dir, "dir", ".demo", "demo directory: bin/ for the built binaries, run/ for a run's state and logs")
	fs.DurationVar(&o.duration, "duration", time.Minute, fmt.Sprintf("how long the writers write (at least %s)", contention.MinDuration))
	fs.BoolVar(&o.exit, "exit", false, "stop everything after the report instead of waiting for Ctrl-C (scripts, tests)")
	fs.StringVar(&o.reportJSON, "report-json", "", "also write `auditsink report --format json` to this file")
	fs.StringVar(&o.policies, "policies", "examples/demo-policies.yaml", "ConcurrencyPolicies to apply (the check of the report against the clients assumes these)")
	_ = fs.Parse(os.Args[1:])
	if o.duration < contention.MinDuration {
		fmt.Fprintf(os.Stderr, "demo: --duration %s is shorter than %s\n", o.duration, contention.MinDuration)
		return 2
	}
	// Library chatter (leader election, controller-runtime) stays out of
	// the terminal; the services log into the run directory.
	ctrllog.SetLogger(logr.Discard())
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)

	// The first Ctrl-C (or SIGTERM) ends the demo in order; once it is
	// shutting down, a second one kills it (the next run cleans up).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	go func() {
		if s, ok := <-sigs; ok {
			cancel(fmt.Errorf("got %s", s))
		}
	}()
	d, err := newDemo(o)
	if err == nil {
		err = d.run(ctx, func() { signal.Stop(sigs) })
	}
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "\ndemo interrupted; everything it started is stopped")
		return 130
	default:
		fmt.Fprintln(os.Stderr, "\ndemo failed:", err)
		return 1
	}
}
