package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

var namespaceGVK = schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}

// Run serves the admission webhook until ctx ends, then drains.
func Run(ctx context.Context, o Options) error {
	o.setDefaults()
	log := o.Logger
	metrics := admission.NewMetrics(o.Registry)
	policies := newPolicyMetrics(o.Registry)
	syncs := webhookconfig.NewSyncMetrics(o.Registry)
	env := &policy.Environment{
		ProtectedNamespaces: append([]string{}, policy.DefaultProtectedNamespaces...),
		BreakGlassGroup:     o.BreakGlassGroup,
	}
	if o.Namespace != "" {
		env.ProtectedNamespaces = append(env.ProtectedNamespaces, o.Namespace)
	}
	var src admission.PolicySource
	var ready func() error
	var mgr manager.Manager
	if o.PolicyFile != "" && o.Configurations != nil {
		return errors.New("keeping the webhook configurations in step needs cluster mode; in file mode print them with the policies instead")
	}
	var fileSet *policy.Set
	if o.PolicyFile != "" {
		ps, err := policy.LoadFile(o.PolicyFile)
		if err != nil {
			return err
		}
		fileSet = policy.NewSet(ps...)
	}
	srv, err := admission.NewServer(admission.ServerOptions{
		Host: o.Host, Port: o.Port, CertDir: o.CertDir, ClientCAFile: o.ClientCAFile,
		MaxReviewBytes: o.MaxReviewBytes, MaxReviewBytesInFlight: o.MaxReviewBytesInFlight, ReviewReadTimeout: o.ReviewReadTimeout,
		Metrics: metrics, Logger: log,
	})
	if err != nil {
		return err
	}

	if fileSet != nil {
		set := fileSet
		policies.set(set.Len(), 0)
		log.Info("policies loaded from file", "file", o.PolicyFile, "policies", set.Names())
		src = admission.NewStaticSource(set)
		ready = func() error { return nil }
	} else {
		if o.RestConfig == nil {
			return errors.New("cluster mode needs a kubeconfig or in-cluster config; or pass a policy file")
		}
		scheme := runtime.NewScheme()
		if err := clientgoscheme.AddToScheme(scheme); err != nil {
			return fmt.Errorf("build scheme: %w", err)
		}
		if err := v1alpha1.AddToScheme(scheme); err != nil {
			return fmt.Errorf("build scheme: %w", err)
		}
		mgr, err = ctrl.NewManager(o.RestConfig, manager.Options{
			Scheme:                 scheme,
			Logger:                 RuntimeLogger(log, o.ShutdownTimeout),
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
			WebhookServer:          srv,
		})
		if err != nil {
			return fmt.Errorf("create manager: %w", err)
		}
		cs := &ClusterSource{client: mgr.GetClient(), cache: mgr.GetCache(), metrics: policies, log: log}
		if err := mgr.Add(cs); err != nil {
			return fmt.Errorf("add policy source: %w", err)
		}
		if o.Configurations != nil {
			co := *o.Configurations
			if co.BreakGlassGroup == "" {
				co.BreakGlassGroup = cmp.Or(o.BreakGlassGroup, "-")
			}
			if co.ProtectedNamespaces == nil {
				co.ProtectedNamespaces = env.ProtectedNamespaces
			}
			if co.ExcludedNamespaces == nil {
				// As `webhook configurations --service` excludes the
				// Service's namespace, the webhook's own.
				co.ExcludedNamespaces = append(slices.Clone(policy.DefaultProtectedNamespaces), o.Namespace)
				co.ExcludedNamespaces = slices.DeleteFunc(co.ExcludedNamespaces, func(ns string) bool { return ns == "" })
			}
			cs.configs = webhookconfig.NewSyncer(mgr.GetAPIReader(), mgr.GetClient(), co, syncs, log)
			if err := mgr.Add(cs.configs); err != nil {
				return fmt.Errorf("add configuration sync: %w", err)
			}
		}
		// Run may be called more than once in a process (tests, the demo):
		// controller names need not be unique process-wide.
		if err := ctrl.NewControllerManagedBy(mgr).Named("concurrencypolicy").
			WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
			For(&v1alpha1.ConcurrencyPolicy{}).Complete(cs); err != nil {
			return fmt.Errorf("create policy controller: %w", err)
		}
		// The manager runs the webhook server only once someone asks for it.
		_ = mgr.GetWebhookServer()
		env.Namespaces = namespaceLabels{ctx: ctx, reader: mgr.GetCache()}
		src, ready = cs, cs.Ready
	}

	srv.Answer(src, env)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	started := srv.StartedChecker()
	isReady := func() error {
		if err := started(nil); err != nil {
			return fmt.Errorf("admission server not serving: %w", err)
		}
		return ready()
	}
	if o.ProbeAddr != "0" {
		ln, err := net.Listen("tcp", o.ProbeAddr)
		if err != nil {
			return fmt.Errorf("listen for probes on %s: %w", o.ProbeAddr, err)
		}
		probes := &http.Server{Handler: probeMux(o.Registry, isReady), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- ignoreClosed(probes.Serve(ln)) }()
		defer func() {
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
			defer scancel()
			_ = probes.Shutdown(sctx)
		}()
	}
	go func() {
		if mgr != nil {
			errc <- mgr.Start(ctx)
		} else {
			errc <- srv.Start(ctx)
		}
	}()
	if o.Ready != nil {
		go notifyReady(ctx, isReady, func() { o.Ready(fmt.Sprintf("%s:%d", o.Host, o.Port)) })
	}
	log.Info("stampguard webhook starting", "port", o.Port, "mode", map[bool]string{true: "file", false: "cluster"}[o.PolicyFile != ""])
	select {
	case <-ctx.Done():
		// The webhook server drains in-flight reviews on cancel, for up to a
		// minute of its own; the pod's grace period is shorter.
		drain := time.NewTimer(o.ShutdownTimeout)
		defer drain.Stop()
		select {
		case err := <-errc:
			return err
		case <-drain.C:
			return fmt.Errorf("reviews still in flight after the shutdown timeout of %s", o.ShutdownTimeout)
		}
	case err := <-errc:
		return err
	}
}

func notifyReady(ctx context.Context, ready func() error, fn func()) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if ready() == nil {
			fn()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func probeMux(reg *prometheus.Registry, ready func() error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{reg, ctrlmetrics.Registry}, promhttp.HandlerOpts{}))
	// healthz.Handler reads the check name from the path below its mount point.
	for path, h := range map[string]*healthz.Handler{
		"/healthz": {Checks: map[string]healthz.Checker{"ping": healthz.Ping}},
		"/readyz":  {Checks: map[string]healthz.Checker{"webhook": func(*http.Request) error { return ready() }}},
	} {
		mux.Handle(path, http.StripPrefix(path, h))
		mux.Handle(path+"/", http.StripPrefix(path, h))
	}
	return mux
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// RuntimeLogger is log for controller-runtime, whose webhook server
// announces a shutdown timeout of its own ("with timeout of 1 minute")
// while Run stops waiting after shutdownTimeout: that line is told with
// the timeout that applies.
func RuntimeLogger(log *slog.Logger, shutdownTimeout time.Duration) logr.Logger {
	return logr.New(&shutdownSink{LogSink: logr.FromSlogHandler(log.Handler()).GetSink(), timeout: shutdownTimeout})
}

const runtimeShutdownLine = "Shutting down webhook server with timeout of "

type shutdownSink struct {
	logr.LogSink
	timeout time.Duration
}

func (s *shutdownSink) Info(level int, msg string, kv ...any) {
	if strings.HasPrefix(msg, runtimeShutdownLine) {
		msg = fmt.Sprintf("%s%s (--shutdown-timeout)", runtimeShutdownLine, s.timeout)
	}
	s.LogSink.Info(level, msg, kv...)
}

func (s *shutdownSink) WithValues(kv ...any) logr.LogSink {
	return &shutdownSink{LogSink: s.LogSink.WithValues(kv...), timeout: s.timeout}
}

func (s *shutdownSink) WithName(name string) logr.LogSink {
	return &shutdownSink{LogSink: s.LogSink.WithName(name), timeout: s.timeout}
}
