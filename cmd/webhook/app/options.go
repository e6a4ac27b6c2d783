package app

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// The defaults of the webhook's flags, and of the Options fields they
// fill when left zero.
const (
	// DefaultPort is the admission server's port (TLS).
	DefaultPort = 9443
	// DefaultCertDir holds tls.crt and tls.key.
	DefaultCertDir = "/etc/stampguard/tls"
	// DefaultProbeAddr serves /healthz, /readyz and /metrics.
	DefaultProbeAddr = ":8081"
	// DefaultShutdownTimeout is under the kubelet's default grace period
	// of 30s, so that a SIGTERM never ends in a SIGKILL.
	DefaultShutdownTimeout = 25 * time.Second
	// DefaultLogLevel and DefaultLogFormat are --log-level's and
	// --log-format's defaults.
	DefaultLogLevel  = "info"
	DefaultLogFormat = "json"
)

// The environment variables the webhook reads; the flag beats each.
const (
	// NamespaceEnv is the default of --namespace (the pod's namespace,
	// from the downward API).
	NamespaceEnv = "POD_NAMESPACE"
	// KubeconfigEnv is the kubeconfig used without --kubeconfig; without
	// either the in-cluster config is.
	KubeconfigEnv = "KUBECONFIG"
)

// Options configure the webhook process.
type Options struct {
	// Host the admission server listens on. Defaults to all addresses:
	// the apiserver reaches a pod through its pod IP, so loopback would
	// be unreachable; the chart passes the pod IP.
	Host string
	// Port of the admission server (TLS). Defaults to DefaultPort (9443).
	Port int
	// CertDir holds tls.crt and tls.key; they are reloaded when they change.
	CertDir string
	// ClientCAFile, when set, makes the admission port require a client
	// certificate signed by a CA of this PEM bundle (the apiserver's
	// admission kubeconfig presents one); it is reloaded when it changes.
	// Empty (the default): no client certificate is asked for.
	ClientCAFile string
	// ProbeAddr serves /healthz, /readyz and /metrics. Defaults to
	// DefaultProbeAddr (":8081"); "0" disables it.
	ProbeAddr string
	// PolicyFile selects file mode: policies come from this multi-document
	// YAML file instead of ConcurrencyPolicy objects.
	PolicyFile string
	// RestConfig reaches the cluster in cluster mode.
	RestConfig *rest.Config
	// Namespace the webhook runs in; policies skip it unless they name it.
	Namespace string
	// BreakGlassGroup members bypass every policy. Defaults to
	// DefaultBreakGlassGroup; "-" disables it.
	BreakGlassGroup string
	// MaxReviewBytes bounds a review body. Defaults to DefaultMaxReviewBytes.
	MaxReviewBytes int64
	// MaxReviewBytesInFlight bounds the review bytes buffered across all
	// connections; at least twice MaxReviewBytes. Defaults to
	// DefaultMaxReviewBytesInFlight. A review that cannot get room before
	// its read deadline is denied.
	MaxReviewBytesInFlight int64
	// ReviewReadTimeout bounds the time from a review's first byte to the
	// end of its body; a review cut by it is denied and its connection
	// closed.
	// Defaults to DefaultReviewReadTimeout.
	ReviewReadTimeout time.Duration
	// ShutdownTimeout bounds the graceful drain after ctx ends: reviews still
	// in flight then are abandoned and Run returns an error. Defaults to
	// DefaultShutdownTimeout (25s), under the kubelet's default grace
	// period of 30s.
	ShutdownTimeout time.Duration
	// Logger for everything. Defaults to slog.Default().
	Logger *slog.Logger
	// Registry collects the webhook's metrics. Defaults to a new registry.
	Registry *prometheus.Registry
	// Ready, when set, is called once the webhook serves with its policies loaded.
	Ready func(addr string)
	// Configurations, when set in cluster mode, makes the webhook keep the
	// two configuration objects named Configurations.Name (which must
	// exist) in step with the live policies: it updates the rules,
	// namespaceSelector and matchConditions of its two webhooks there and
	// nothing else (RBAC: get and update on those two objects). Its
	// Policies and, when unset, BreakGlassGroup and ProtectedNamespaces are
	// filled in from the webhook's own. Nil (the default) leaves the
	// configurations alone.
	Configurations *webhookconfig.ConfigOptions
}

func (o *Options) setDefaults() {
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.ProbeAddr == "" {
		o.ProbeAddr = DefaultProbeAddr
	}
	if o.BreakGlassGroup == "" {
		o.BreakGlassGroup = webhookconfig.DefaultBreakGlassGroup
	}
	if o.BreakGlassGroup == "-" {
		o.BreakGlassGroup = ""
	}
	if o.MaxReviewBytes == 0 {
		o.MaxReviewBytes = admission.DefaultMaxReviewBytes
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
}

// ServeFlags are the flags of the webhook's serving command: the options
// boundary of `webhook`. Register binds them with the Default* values;
// Resolve validates all of them, touching nothing but the files they name,
// and returns the Options of Run. The rule for every option with both: an
// explicit flag beats the environment, the environment beats files and
// defaults.
type ServeFlags struct {
	Options Options
	// Kubeconfig is --kubeconfig; empty: $KUBECONFIG, then the in-cluster
	// config.
	Kubeconfig string
	// LogLevel and LogFormat are --log-level and --log-format.
	LogLevel, LogFormat string
	// CPUProfile is --cpu-profile: a Go CPU profile of the whole run is
	// written there (diagnostics); empty writes none.
	CPUProfile string
	// SyncConfigurations, SyncResources, SyncNamespaceSelector and
	// SyncExcludedNamespaces are --sync-configurations and the flags that
	// need it. --sync-configurations defaults to DefaultConfigName in
	// cluster mode and to none in file mode; given empty, the webhook
	// leaves the configurations alone.
	SyncConfigurations, SyncResources, SyncNamespaceSelector, SyncExcludedNamespaces string
	syncSet, syncExcludedSet                                                         bool
}

// Register binds f to fs.
func (f *ServeFlags) Register(fs *flag.FlagSet) {
	o := &f.Options
	fs.StringVar(&o.Host, "host", "", "`address` the admission server listens on (default all: the apiserver reaches a pod through its pod IP; the chart passes it)")
	fs.IntVar(&o.Port, "port", DefaultPort, "admission server `port` (TLS), 1 to 65535")
	fs.StringVar(&o.CertDir, "cert-dir", DefaultCertDir, "`directory` with tls.crt and tls.key; reloaded on change")
	fs.StringVar(&o.ClientCAFile, "client-ca", "", "PEM CA bundle `file`: require the apiserver's client certificate, signed by one of these CAs, on the admission port (reloaded on change; default no client certificate)")
	fs.StringVar(&o.ProbeAddr, "probe-addr", DefaultProbeAddr, "`address` for /healthz, /readyz and /metrics (\"0\" disables)")
	fs.StringVar(&o.PolicyFile, "policy-file", "", "file mode: read policies from this multi-document YAML `file` instead of the cluster")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv(NamespaceEnv), "the webhook's own `namespace`, never guarded unless a policy names it (default $"+NamespaceEnv+")")
	fs.StringVar(&o.BreakGlassGroup, "break-glass-group", webhookconfig.DefaultBreakGlassGroup, "members of this `group` bypass every policy (\"-\" disables)")
	fs.Int64Var(&o.MaxReviewBytes, "max-review-bytes", admission.DefaultMaxReviewBytes, "largest AdmissionReview body accepted, in `bytes`; the apiserver refuses request bodies over 3 MiB and a review carries object and oldObject, so 8 MiB is above any real review")
	fs.Int64Var(&o.MaxReviewBytesInFlight, "max-review-bytes-in-flight", admission.DefaultMaxReviewBytesInFlight, "review `bytes` buffered at once across all connections (at least twice --max-review-bytes); a review past the budget waits its turn or is denied")
	fs.DurationVar(&o.ReviewReadTimeout, "review-read-timeout", admission.DefaultReviewReadTimeout, "how long a review may take to arrive, from its first byte to the end of its body; a slower one is denied and its connection closed")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout, "how long SIGTERM waits for reviews in flight; keep it under the pod's terminationGracePeriodSeconds (30s by default)")
	f.SyncConfigurations = webhookconfig.DefaultConfigName
	fs.Func("sync-configurations", "keep the Mutating- and ValidatingWebhookConfiguration of this `name` in step with the policies, so that only what they guard is routed (default "+webhookconfig.DefaultConfigName+" in cluster mode, none in file mode); empty leaves them alone", func(v string) error {
		f.SyncConfigurations, f.syncSet = v, true
		return nil
	})
	fs.Func("sync-excluded-namespaces", "with --sync-configurations: the --excluded-namespaces the configurations were made with, `namespaces` (default "+strings.Join(policy.DefaultProtectedNamespaces, ",")+" and --namespace)", func(v string) error {
		f.SyncExcludedNamespaces, f.syncExcludedSet = v, true
		return nil
	})
	fs.StringVar(&f.SyncResources, "sync-resources", "", "with --sync-configurations: the --resources the configurations were made with, `group/resource,...` (default the same default)")
	fs.StringVar(&f.SyncNamespaceSelector, "sync-namespace-selector", "", "with --sync-configurations: the --namespace-selector the configurations were made with, `labels` (default all namespaces)")
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig `file` for cluster mode (default $"+KubeconfigEnv+", then the in-cluster config)")
	fs.StringVar(&f.LogLevel, "log-level", DefaultLogLevel, "log `level`: debug, info, warn or error")
	fs.StringVar(&f.LogFormat, "log-format", DefaultLogFormat, "log `format`: json or text")
	fs.StringVar(&f.CPUProfile, "cpu-profile", "", "write a Go CPU profile (pprof) of the whole run to this `file` (diagnostics)")
}

// Resolve validates f and returns the Options of Run, with a logger on w.
// Every error is a cli.UsageError naming the flag or file at fault.
func (f *ServeFlags) Resolve(w io.Writer) (Options, error) {
	o := f.Options
	log, err := cli.NewLogger(w, f.LogLevel, f.LogFormat)
	if err != nil {
		return Options{}, err
	}
	o.Logger = log
	switch {
	case o.Port < 1 || o.Port > 65535:
		return Options{}, cli.Usagef("--port %d: want 1 to 65535", o.Port)
	case o.MaxReviewBytes < 1:
		return Options{}, cli.Usagef("--max-review-bytes %d: want a positive number of bytes (default %d)", o.MaxReviewBytes, admission.DefaultMaxReviewBytes)
	case o.ReviewReadTimeout <= 0:
		return Options{}, cli.Usagef("--review-read-timeout %s: want a positive duration (default %s)", o.ReviewReadTimeout, admission.DefaultReviewReadTimeout)
	case o.ShutdownTimeout <= 0:
		return Options{}, cli.Usagef("--shutdown-timeout %s: want a positive duration (default %s)", o.ShutdownTimeout, DefaultShutdownTimeout)
	case o.ProbeAddr == "":
		return Options{}, cli.Usagef("--probe-addr is empty: give an address, or \"0\" to serve no probes")
	case o.BreakGlassGroup == "":
		return Options{}, cli.Usagef("--break-glass-group is empty: name a group, or \"-\" for none")
	}
	if err := admission.CheckReviewLimits(o.MaxReviewBytes, o.MaxReviewBytesInFlight); err != nil {
		return Options{}, cli.Usagef("--max-review-bytes-in-flight: %w", err)
	}
	if o.ClientCAFile != "" {
		if _, err := os.Stat(o.ClientCAFile); err != nil {
			return Options{}, cli.Usagef("--client-ca: %w", err)
		}
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(o.CertDir, name)); err != nil {
			return Options{}, cli.Usagef("--cert-dir: %w", err)
		}
	}
	if o.PolicyFile != "" && !f.syncSet {
		f.SyncConfigurations = "" // the default is cluster mode's
	}
	if f.SyncConfigurations == "" {
		excluded := ""
		if f.syncExcludedSet {
			excluded = "-"
		}
		for flagName, v := range map[string]string{"--sync-resources": f.SyncResources, "--sync-namespace-selector": f.SyncNamespaceSelector, "--sync-excluded-namespaces": excluded} {
			if v != "" {
				return Options{}, cli.Usagef("%s needs --sync-configurations NAME: without it the webhook leaves the configurations alone", flagName)
			}
		}
	}
	if o.PolicyFile != "" {
		if f.syncSet && f.SyncConfigurations != "" || f.Kubeconfig != "" {
			return Options{}, cli.Usagef("--policy-file is file mode; --sync-configurations and --kubeconfig are for cluster mode: give one mode (in file mode, print the configurations with `webhook configurations --policy-file`)")
		}
		ps, err := policy.LoadFile(o.PolicyFile)
		if err != nil {
			return Options{}, cli.Usagef("--policy-file: %w", err)
		}
		if len(ps) == 0 {
			return Options{}, cli.Usagef("--policy-file %s holds no policies: the webhook would guard nothing", o.PolicyFile)
		}
		return o, nil
	}
	if o.RestConfig, err = restConfig(f.Kubeconfig); err != nil {
		return Options{}, err
	}
	if f.SyncConfigurations != "" {
		co := &webhookconfig.ConfigOptions{Name: f.SyncConfigurations}
		if f.SyncResources != "" {
			if co.Resources, err = webhookconfig.ParseGuardedResources(f.SyncResources); err != nil {
				return Options{}, cli.Usagef("--sync-resources: %w", err)
			}
		}
		if f.SyncNamespaceSelector != "" {
			if co.NamespaceSelector, err = metav1.ParseToLabelSelector(f.SyncNamespaceSelector); err != nil {
				return Options{}, cli.Usagef("--sync-namespace-selector: %w", err)
			}
		}
		if f.syncExcludedSet {
			if co.ExcludedNamespaces, err = webhookconfig.ParseNamespaces(f.SyncExcludedNamespaces); err != nil {
				return Options{}, cli.Usagef("--sync-excluded-namespaces: %w", err)
			}
		}
		o.Configurations = co
	}
	return o, nil
}

// restConfig finds the cluster: --kubeconfig, else $KUBECONFIG, else the
// in-cluster config.
func restConfig(kubeconfig string) (*rest.Config, error) {
	from := "--kubeconfig"
	if kubeconfig == "" {
		kubeconfig, from = os.Getenv(KubeconfigEnv), "$"+KubeconfigEnv
	}
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, cli.Usagef("%s %s: %w", from, kubeconfig, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, cli.Usagef("no cluster to read policies from (%w): give --kubeconfig FILE (or $%s) for cluster mode outside a pod, or --policy-file FILE for file mode", err, KubeconfigEnv)
	}
	return c, nil
}
