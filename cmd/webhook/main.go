// Command webhook is stampguard's admission webhook: it refuses stampless
// updates and enforces field owners, immutable fields and delete
// preconditions as ConcurrencyPolicies say.
//
//	webhook [flags]                 serve the admission webhook
//	webhook configurations [flags]  print the webhook configurations as YAML
//	webhook replay [flags] LOG...   what the policies would have refused,
//	                                from the apiserver's audit log
//
// The flags are cmd/webhook/app's (ServeFlags, RegisterConfigFlags,
// ReplayFlags), which validate everything before the webhook starts: exit
// code 2 for a bad command line, 1 for a failure while running
// (internal/cli).
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

	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/stampguard/stampguard/cmd/webhook/app"
	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: webhook [flags]                 serve the admission webhook
       webhook configurations [flags]  print the MutatingWebhookConfiguration and
                                       ValidatingWebhookConfiguration as YAML
       webhook replay --policy-file FILE [flags] AUDIT_LOG...
                                       what the policies would have refused, replayed
                                       from the apiserver's audit log by the webhook's code
Exit codes: 0 done, 2 a bad command line (nothing was started), 1 a failure while running.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "configurations" {
		return configurations(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "replay" {
		return replayLogs(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "help" {
		args = []string{"-h"}
	}
	fs, f := serveFlags()
	err := func() error {
		if _, err := cli.Parse(fs, args, 0, stdout); err != nil {
			return err
		}
		o, err := f.Resolve(stderr)
		if err != nil {
			return err
		}
		ctrllog.SetLogger(app.RuntimeLogger(o.Logger, o.ShutdownTimeout))
		if f.CPUProfile != "" {
			stop, err := cli.StartCPUProfile(f.CPUProfile)
			if err != nil {
				return err
			}
			defer func() {
				if err := stop(); err != nil {
					o.Logger.Error("write CPU profile", "err", err)
				}
			}()
		}
		if err := app.Run(ctx, o); err != nil {
			o.Logger.Error("webhook stopped", "err", err)
			return err
		}
		return nil
	}()
	code := cli.ExitCode(err)
	if code == cli.ExitUsage {
		fmt.Fprintf(stderr, "webhook: %v\nRun 'webhook -h' for its flags.\n", err)
	}
	return code
}

// serveFlags is the flag set of the serving command.
func serveFlags() (*flag.FlagSet, *app.ServeFlags) {
	// Our own flag set: controller-runtime's client/config package registers
	// --kubeconfig on flag.CommandLine in its init, and a second
	// registration there panics before any flag is parsed.
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage+"\nflags:\n")
		fs.PrintDefaults()
	}
	var f app.ServeFlags
	f.Register(fs)
	return fs, &f
}

// configurationsFlags is the flag set of `webhook configurations`.
func configurationsFlags() (*flag.FlagSet, *webhookconfig.ConfigOptions) {
	fs := flag.NewFlagSet("webhook configurations", flag.ContinueOnError)
	cli.SetUsage(fs, "webhook configurations --url URL | --service NAMESPACE/NAME[:PORT] [flags] | kubectl apply -f -")
	var o webhookconfig.ConfigOptions
	app.RegisterConfigFlags(fs, &o)
	return fs, &o
}

// configurations prints what webhookconfig.Configurations builds for the flags.
func configurations(args []string, stdout, stderr io.Writer) int {
	fs, o := configurationsFlags()
	err := func() error {
		if _, err := cli.Parse(fs, args, 0, stdout); err != nil {
			return err
		}
		if err := o.Validate(); err != nil {
			return cli.Usage(err)
		}
		return webhookconfig.WriteConfigurations(stdout, *o)
	}()
	code := cli.ExitCode(err)
	if code != cli.ExitOK {
		fmt.Fprintf(stderr, "webhook configurations: %v\n", err)
		if code == cli.ExitUsage {
			fmt.Fprintln(stderr, "Run 'webhook configurations -h' for its flags.")
		}
	}
	return code
}

// replayFlags is the flag set of `webhook replay`.
func replayFlags() (*flag.FlagSet, *app.ReplayFlags) {
	fs := flag.NewFlagSet("webhook replay", flag.ContinueOnError)
	cli.SetUsage(fs, "webhook replay --policy-file FILE | --policies-from-cluster [--kubeconfig FILE] [--since T] [--until T] [--format table|json] AUDIT_LOG...")
	var f app.ReplayFlags
	f.Register(fs)
	return fs, &f
}

// replayLogs runs `webhook replay`: its flags in, app.Replay out.
func replayLogs(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, f := replayFlags()
	err := func() error {
		paths, err := cli.Parse(fs, args, -1, stdout)
		if err != nil {
			return err
		}
		r, err := f.Resolve(paths, time.Now())
		if err != nil {
			return err
		}
		return r.Execute(ctx, stdout)
	}()
	code := cli.ExitCode(err)
	if code != cli.ExitOK {
		fmt.Fprintf(stderr, "webhook replay: %v\n", err)
		if code == cli.ExitUsage {
			fmt.Fprintln(stderr, "Run 'webhook replay -h' for its flags.")
		}
	}
	return code
}
