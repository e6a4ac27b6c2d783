// Command webhook is stampguard's admission webhook: it refuses stampless
// updates and enforces field owners, immutable fields and delete
// preconditions as ConcurrencyPolicies say.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/stampguard/stampguard/policy/admission"
)

func main() { os.Exit(run()) }

func run() int {
	// Our own flag set: controller-runtime's client/config package registers
	// --kubeconfig on flag.CommandLine in its init, and a second
	// registration there panics before any flag is parsed.
	flag := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	var o admission.Options
	var kubeconfig, logLevel, logFormat, configurations string
	flag.StringVar(&o.Host, "host", "", "address the admission server listens on (default all)")
	flag.IntVar(&o.Port, "port", 9443, "admission server port (TLS)")
	flag.StringVar(&o.CertDir, "cert-dir", "/etc/stampguard/tls", "directory with tls.crt and tls.key; reloaded on change")
	flag.StringVar(&o.ProbeAddr, "probe-addr", ":8081", "address for /healthz, /readyz and /metrics (\"0\" disables)")
	flag.StringVar(&o.PolicyFile, "policy-file", "", "read policies from this multi-document YAML file instead of the cluster")
	flag.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the webhook's own namespace, never guarded unless a policy names it")
	flag.StringVar(&o.BreakGlassGroup, "break-glass-group", admission.DefaultBreakGlassGroup, "members bypass every policy (\"-\" disables)")
	flag.Int64Var(&o.MaxReviewBytes, "max-review-bytes", admission.DefaultMaxReviewBytes, "largest AdmissionReview body accepted")
	flag.StringVar(&configurations, "sync-configurations", "", "cluster mode: keep the Mutating- and ValidatingWebhookConfiguration of this name in step with the policies (pre-filter); empty leaves them alone")
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig for cluster mode (default in-cluster config)")
	flag.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	flag.StringVar(&logFormat, "log-format", "json", "json or text")
	_ = flag.Parse(os.Args[1:]) // ExitOnError: -h exits 0, a bad flag exits 2

	log, err := newLogger(logLevel, logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		return 2
	}
	o.Logger = log
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	if o.PolicyFile == "" {
		o.RestConfig, err = restConfig(kubeconfig)
		if err != nil {
			log.Error("no cluster to read policies from", "err", err)
			return 2
		}
	}
	if configurations != "" {
		o.Configurations = &admission.ConfigOptions{Name: configurations}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := admission.Run(ctx, o); err != nil {
		log.Error("webhook stopped", "err", err)
		return 1
	}
	return 0
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}
