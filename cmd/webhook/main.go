// Command webhook is stampguard's admission webhook: it refuses stampless
// updates and enforces field owners, immutable fields and delete
// preconditions as ConcurrencyPolicies say.
//
//	webhook [flags]                 serve the admission webhook
//	webhook configurations [flags]  print the webhook configurations as YAML
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/stampguard/stampguard/policy/admission"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "configurations" {
		os.Exit(configurations(os.Args[2:]))
	}
	os.Exit(run())
}

const usage = `usage: webhook [flags]                 serve the admission webhook
       webhook configurations [flags]  print the MutatingWebhookConfiguration and
                                       ValidatingWebhookConfiguration as YAML

flags:
`

func run() int {
	// Our own flag set: controller-runtime's client/config package registers
	// --kubeconfig on flag.CommandLine in its init, and a second
	// registration there panics before any flag is parsed.
	flag := flag.NewFlagSet("webhook", flag.ExitOnError)
	flag.Usage = func() {
		fmt.Fprint(flag.Output(), usage)
		flag.PrintDefaults()
	}
	var o admission.Options
	var kubeconfig, logLevel, logFormat, configurations, syncResources, syncSelector, syncExcluded string
	syncExcludedSet := false
	flag.StringVar(&o.Host, "host", "", "address the admission server listens on (default all)")
	flag.IntVar(&o.Port, "port", 9443, "admission server port (TLS)")
	flag.StringVar(&o.CertDir, "cert-dir", "/etc/stampguard/tls", "directory with tls.crt and tls.key; reloaded on change")
	flag.StringVar(&o.ProbeAddr, "probe-addr", ":8081", "address for /healthz, /readyz and /metrics (\"0\" disables)")
	flag.StringVar(&o.PolicyFile, "policy-file", "", "read policies from this multi-document YAML file instead of the cluster")
	flag.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the webhook's own namespace, never guarded unless a policy names it")
	flag.StringVar(&o.BreakGlassGroup, "break-glass-group", admission.DefaultBreakGlassGroup, "members bypass every policy (\"-\" disables)")
	flag.Int64Var(&o.MaxReviewBytes, "max-review-bytes", admission.DefaultMaxReviewBytes, "largest AdmissionReview body accepted; the apiserver refuses request bodies over 3 MiB and a review carries object and oldObject, so 8 MiB is above any real review")
	flag.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 25*time.Second, "how long SIGTERM waits for reviews in flight; keep it under the pod's terminationGracePeriodSeconds (30s by default)")
	flag.StringVar(&configurations, "sync-configurations", admission.DefaultConfigName, "cluster mode: keep the Mutating- and ValidatingWebhookConfiguration of this name in step with the policies (the pre-filter; webhook configurations prints them routing nothing until then); \"\" leaves them alone. Ignored in file mode unless given")
	flag.StringVar(&syncResources, "sync-resources", "", "with --sync-configurations: the --resources the configurations were made with (default the same default)")
	flag.StringVar(&syncSelector, "sync-namespace-selector", "", "with --sync-configurations: the --namespace-selector the configurations were made with (default all namespaces)")
	flag.Func("sync-excluded-namespaces", "with --sync-configurations: the --excluded-namespaces the configurations were made with (default kube-system,kube-node-lease and --namespace)", func(s string) error {
		syncExcluded, syncExcludedSet = s, true
		return nil
	})
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
	if o.PolicyFile != "" && !isSet(flag, "sync-configurations") {
		configurations = "" // the default is cluster mode's
	}
	if configurations != "" {
		co := &admission.ConfigOptions{Name: configurations}
		if syncResources != "" {
			if co.Resources, err = admission.ParseGuardedResources(syncResources); err != nil {
				log.Error("bad --sync-resources", "err", err)
				return 2
			}
		}
		if syncSelector != "" {
			if co.NamespaceSelector, err = metav1.ParseToLabelSelector(syncSelector); err != nil {
				log.Error("bad --sync-namespace-selector", "err", err)
				return 2
			}
		}
		if syncExcludedSet {
			if co.ExcludedNamespaces, err = admission.ParseNamespaces(syncExcluded); err != nil {
				log.Error("bad --sync-excluded-namespaces", "err", err)
				return 2
			}
		}
		o.Configurations = co
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := admission.Run(ctx, o); err != nil {
		log.Error("webhook stopped", "err", err)
		return 1
	}
	return 0
}

// configurations prints what admission.Configurations builds for the flags.
func configurations(args []string) int {
	fs := flag.NewFlagSet("webhook configurations", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: webhook configurations --url URL | --service NAMESPACE/NAME[:PORT] [flags] | kubectl apply -f -\n\nflags:\n")
		fs.PrintDefaults()
	}
	var o admission.ConfigOptions
	admission.RegisterConfigFlags(fs, &o)
	_ = fs.Parse(args) // ExitOnError: -h exits 0, a bad flag or value exits 2
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "webhook configurations: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := admission.WriteConfigurations(os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "webhook configurations:", err)
		return 2
	}
	return 0
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
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
