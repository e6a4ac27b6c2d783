package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/tlsserve"
)

// Options configure `auditsink serve`. Defaults are stated per field and
// applied by Run.
type Options struct {
	// Listen is the HTTPS (or plaintext) address; defaulted to DefaultListen (":8443").
	Listen string
	// TLSCertFile and TLSKeyFile serve TLS (>= 1.2, AEAD suites, HTTP/1.1;
	// internal/tlsserve), reloaded when they change. Required unless
	// Plaintext.
	TLSCertFile, TLSKeyFile string
	// Plaintext serves HTTP without TLS. Off by default.
	Plaintext bool
	// ClientCAFile, when set, verifies client certificates against this CA
	// bundle (reloaded when the file changes) and accepts requests that
	// present a valid one whose name is in ClientNames. The handshake does
	// not require one: a request with a valid token passes with any
	// certificate or none.
	ClientCAFile string
	// ClientNames is the allow-list of client certificate names (Common
	// Name or DNS name), each with the clusters it may write (none: any);
	// required with ClientCAFile. See HandlerOptions.ClientNames.
	ClientNames map[string][]string
	// Token accepts "Authorization: Bearer <Token>".
	Token string
	// TokenClusters are the clusters the token may write; empty: any.
	TokenClusters []string
	// NoMigrate runs no DDL: the drainer waits until the schema is at this
	// binary's version (migrated by `auditsink migrate`), so that serve
	// can run as a ClickHouse user without DDL rights. Off, serve still
	// skips the DDL when the schema is current, and migrates otherwise.
	NoMigrate bool
	// AllowUnauthenticated accepts requests without credentials.
	AllowUnauthenticated bool
	// Cluster is the cluster of POST /events; defaulted to DefaultCluster
	// ("default").
	Cluster string
	// MetricsListen serves /metrics (plain HTTP) when set, e.g. ":9090".
	MetricsListen string

	Store store.Options
	// SpoolDir holds the spool. Required.
	SpoolDir string
	// SpoolMaxBytes caps the spool; when it is full the sink answers 503.
	// Defaulted to spool.DefaultMaxBytes (1 GiB).
	SpoolMaxBytes int64
	// Stages stored; defaulted to ResponseComplete and Panic.
	Stages []string
	// RedactResources are removed like secrets (always removed).
	RedactResources []string
	// History stores the field history of the writes logged with their
	// responses (internal/audit, fields.go) under its key; nil stores none.
	History *audit.FieldHasher
	// LostUpdates is the periodic count of lost updates into the gauge
	// auditsink_lost_updates (pipeline.LostUpdateOptions; off by
	// default, on at serve's flags' defaults).
	LostUpdates pipeline.LostUpdateOptions
	// MaxBodyBytes defaulted to DefaultMaxBodyBytes; MaxEventBytes to
	// audit.DefaultMaxEventBytes.
	MaxBodyBytes  int64
	MaxEventBytes int
	// Retention drops day partitions older than this (0 keeps all).
	Retention time.Duration
	// InsertParallel is the number of ClickHouse inserts in flight;
	// defaulted by pipeline.DrainerOptions.
	InsertParallel int
	// ShutdownTimeout bounds a graceful shutdown; defaulted to
	// DefaultShutdownTimeout (20s), below Kubernetes' default grace period
	// of 30s. Bodies still arriving a quarter of it after the signal are
	// cut; what remains at the deadline is closed, and logged.
	ShutdownTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long; defaulted
	// to 2m (the apiserver's client keeps idle connections 90s).
	IdleTimeout time.Duration
	// BodyGrace and BodyMinRate bound a body's read time; see
	// HandlerOptions (defaulted to 10s and 64 KiB/s).
	BodyGrace   time.Duration
	BodyMinRate int64

	Logger *slog.Logger
	// Registry receives the metrics; defaulted to a new registry with the
	// Go and process collectors.
	Registry *prometheus.Registry
	// Ready, if set, is called with the bound address once serving.
	Ready func(addr net.Addr)
}

// DefaultListen is Options.Listen's default.
const DefaultListen = ":8443"

// DefaultShutdownTimeout is Options.ShutdownTimeout's default: below the
// 30 s default terminationGracePeriodSeconds of a pod, so that a SIGTERM
// never ends in a SIGKILL.
const DefaultShutdownTimeout = 20 * time.Second

// Run serves until ctx is done: it opens the spool (replaying what was not
// confirmed), starts the drainer (which applies the migrations first, and
// waits for ClickHouse if it is away), and serves the endpoint. On shutdown
// it keeps listening and answers 503 to new batches while the in-flight
// ones finish (bodies still arriving after ShutdownTimeout/4 are cut),
// then closes the listener and stops, within ShutdownTimeout.
func Run(ctx context.Context, o Options) error {
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.SpoolDir == "" {
		return errors.New("a spool directory is required")
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
		o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	certs, err := serverTLS(o)
	if err != nil {
		return err
	}
	metrics := pipeline.NewMetrics(o.Registry)
	log := o.Logger

	sp, err := spool.Open(o.SpoolDir, spool.Options{MaxBytes: o.SpoolMaxBytes, Logger: log.With("component", "spool"),
		Observe: func(st spool.Stats) { metrics.SpoolBytes.Set(float64(st.BytesOnDisk)) }})
	if err != nil {
		return fmt.Errorf("open spool: %w", err)
	}
	defer sp.Close()
	o.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "auditsink_spool_oldest_unconfirmed_seconds",
		Help: "Age of the oldest spool record not yet stored in ClickHouse (0 when all are): the insert lag.",
	}, func() float64 {
		if at := sp.Stats().OldestUnconfirmed; !at.IsZero() {
			return time.Since(at).Seconds()
		}
		return 0
	}))
	st, err := store.Open(ctx, o.Store)
	if err != nil {
		return err
	}
	defer st.Close()

	var verifyClient func([]*x509.Certificate) error
	if certs != nil && certs.HasClientCA() {
		verifyClient = certs.VerifyClient
	}
	h, err := NewHandler(HandlerOptions{
		VerifyClient: verifyClient,
		Accepter:     NewAccepter(o.Stages, o.RedactResources, o.Store.KeepRaw, o.History),
		Spool:        sp, Token: o.Token, TokenClusters: o.TokenClusters, ClientNames: o.ClientNames,
		AllowUnauthenticated: o.AllowUnauthenticated, DefaultCluster: o.Cluster,
		MaxBodyBytes: o.MaxBodyBytes, MaxEventBytes: o.MaxEventBytes,
		BodyGrace: o.BodyGrace, BodyMinRate: o.BodyMinRate,
		Metrics: metrics, Logger: log,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	var wg sync.WaitGroup
	if certs != nil {
		ln = tls.NewListener(ln, certs.TLSConfig())
		wg.Go(func() {
			if err := certs.Start(bg); err != nil {
				log.Error("the certificate watcher stopped; the serving certificate is no longer reloaded", "err", err)
			}
		})
	}
	// No ReadTimeout: the handler bounds each body by its size (see
	// HandlerOptions.BodyMinRate), so a 1 GiB body is not cut while a
	// slow one is.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: o.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	// The drainer's inserts in flight at shutdown finish until the shutdown
	// deadline.
	finish, stopFinish := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFinish()
	drainerErr := make(chan error, 1)
	wg.Go(func() {
		if err := pipeline.DrainSpool(bg, sp, st, pipeline.SpoolOptions{NoMigrate: o.NoMigrate, Retention: o.Retention,
			Parallel: o.InsertParallel, Finish: finish, LostUpdates: o.LostUpdates, Metrics: metrics, Logger: log}); err != nil {
			drainerErr <- err
		}
	})
	stopMetrics := func(context.Context) {}
	if o.MetricsListen != "" {
		stopMetrics = ServeMetrics(o.MetricsListen, o.Registry, log)
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("audit sink serving", "addr", ln.Addr().String(), "tls", certs != nil, "database", st.Database())
	if o.Ready != nil {
		o.Ready(ln.Addr())
	}

	select {
	case err = <-serveErr:
	case err = <-drainerErr:
		log.Error("stopping: the spool drainer failed", "err", err)
	case <-ctx.Done():
	}
	// Keep listening, answering new batches 503 (the apiserver retries
	// them), while the in-flight ones finish; cut bodies that are still
	// arriving after a quarter of the timeout.
	stopping := time.Now()
	h.Drain()
	h.CutBodies(stopping.Add(o.ShutdownTimeout / 4))
	shutdownCtx, cancel := context.WithDeadlineCause(context.WithoutCancel(ctx), stopping.Add(o.ShutdownTimeout),
		fmt.Errorf("in-flight audit batches did not finish within the shutdown timeout (%s)", o.ShutdownTimeout))
	defer cancel()
	defer context.AfterFunc(shutdownCtx, stopFinish)()
	_ = h.Wait(shutdownCtx)
	if serr := srv.Shutdown(shutdownCtx); serr != nil {
		log.Error("shutdown hit its deadline; closing the remaining connections", "err", context.Cause(shutdownCtx), "timeout", o.ShutdownTimeout)
		_ = srv.Close()
	}
	stopMetrics(shutdownCtx)
	stopBG()
	wg.Wait()
	log.Info("audit sink stopped", "shutdownTook", time.Since(stopping).Round(time.Millisecond))
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ServeMetrics serves reg on addr (GET /metrics, plain HTTP) in the
// background until the returned stop is called; a listener that fails is
// logged. For serve, and for tail's --metrics-listen.
func ServeMetrics(addr string, reg *prometheus.Registry, log *slog.Logger) (stop func(context.Context)) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener failed", "err", err)
		}
	}()
	return func(ctx context.Context) { _ = srv.Shutdown(ctx) }
}

// NewAccepter decodes and filters events for the sink, ingest and tail
// alike: it keeps stages (none: audit.DefaultStages), drops the objects
// of the redacted resources like those of secrets, and keeps each event's
// raw JSON when keepRaw, and the field histories hashed by history (nil:
// none).
func NewAccepter(stages, redact []string, keepRaw bool, history *audit.FieldHasher) *pipeline.Accepter {
	return &pipeline.Accepter{
		Decoder: audit.Decoder{RedactResources: redact, KeepRaw: keepRaw, History: history},
		Stages:  stages,
	}
}

// serverTLS loads the serving certificate and the client CA, which the
// listener and the handler then follow on disk (internal/tlsserve, as the
// webhook does). The handshake only requests a client certificate and
// names no acceptable CAs, so that a client sends its certificate
// whatever its CA, and a certificate the handler cannot verify still
// leaves the token to decide. Nil for plaintext.
func serverTLS(o Options) (*tlsserve.Server, error) {
	if o.Plaintext {
		if o.ClientCAFile != "" {
			return nil, errors.New("client certificate authentication needs TLS")
		}
		return nil, nil
	}
	if o.TLSCertFile == "" || o.TLSKeyFile == "" {
		return nil, errors.New("TLS needs a certificate and key (or pass the plaintext flag explicitly)")
	}
	return tlsserve.New(tlsserve.Options{CertFile: o.TLSCertFile, KeyFile: o.TLSKeyFile, ClientCAFile: o.ClientCAFile})
}
