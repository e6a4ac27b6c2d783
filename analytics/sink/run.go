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
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/spool"
)

// Options configure `auditsink serve`. Defaults are stated per field and
// applied by Run.
type Options struct {
	// Listen is the HTTPS (or plaintext) address; defaulted to ":8443".
	Listen string
	// TLSCertFile and TLSKeyFile serve TLS. Required unless Plaintext.
	TLSCertFile, TLSKeyFile string
	// Plaintext serves HTTP without TLS. Off by default.
	Plaintext bool
	// ClientCAFile, when set, verifies client certificates against this CA
	// bundle and accepts requests that present a valid one.
	ClientCAFile string
	// Token accepts "Authorization: Bearer <Token>".
	Token string
	// AllowUnauthenticated accepts requests without credentials.
	AllowUnauthenticated bool
	// Cluster, when set, also serves POST /events for this cluster name.
	Cluster string
	// MetricsListen serves /metrics (plain HTTP) when set, e.g. ":9090".
	MetricsListen string

	Store analytics.StoreOptions
	// SpoolDir holds the spool. Required.
	SpoolDir string
	// SpoolMaxBytes caps the spool; when it is full the sink answers 503.
	// Defaulted to spool.DefaultMaxBytes (1 GiB).
	SpoolMaxBytes int64
	// Stages stored; defaulted to ResponseComplete and Panic.
	Stages []string
	// RedactResources are removed like secrets (always removed).
	RedactResources []string
	// MaxBodyBytes defaulted to DefaultMaxBodyBytes; MaxEventBytes to
	// analytics.DefaultMaxEventBytes.
	MaxBodyBytes  int64
	MaxEventBytes int
	// Retention drops day partitions older than this (0 keeps all).
	Retention time.Duration
	// InsertParallel is the number of ClickHouse inserts in flight;
	// defaulted by analytics.DrainerOptions.
	InsertParallel int

	Logger *slog.Logger
	// Registry receives the metrics; defaulted to a new registry with the
	// Go and process collectors.
	Registry *prometheus.Registry
	// Ready, if set, is called with the bound address once serving.
	Ready func(addr net.Addr)
}

// Run serves until ctx is done: it opens the spool (replaying what was not
// confirmed), starts the writer (which applies the migrations first, and
// waits for ClickHouse if it is away), and serves the endpoint. On shutdown
// it answers 503 to new batches, waits for the in-flight ones, and stops.
func Run(ctx context.Context, o Options) error {
	if o.Listen == "" {
		o.Listen = ":8443"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.SpoolDir == "" {
		return errors.New("serve: a spool directory is required")
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
		o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	tlsConfig, err := serverTLS(o)
	if err != nil {
		return err
	}
	metrics := analytics.NewMetrics(o.Registry)
	log := o.Logger

	sp, err := spool.Open(o.SpoolDir, spool.Options{MaxBytes: o.SpoolMaxBytes, Logger: log.With("component", "spool")})
	if err != nil {
		return fmt.Errorf("open spool: %w", err)
	}
	defer sp.Close()
	store, err := analytics.OpenStore(ctx, o.Store)
	if err != nil {
		return err
	}
	defer store.Close()

	h, err := NewHandler(HandlerOptions{
		Accepter: &analytics.Accepter{
			Decoder: analytics.Decoder{RedactResources: o.RedactResources, KeepRaw: o.Store.KeepRaw},
			Stages:  o.Stages, Metrics: metrics,
		},
		Spool: sp, Token: o.Token, ClientCertAuth: o.ClientCAFile != "",
		AllowUnauthenticated: o.AllowUnauthenticated, DefaultCluster: o.Cluster,
		MaxBodyBytes: o.MaxBodyBytes, MaxEventBytes: o.MaxEventBytes,
		Metrics: metrics, Logger: log,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	var wg sync.WaitGroup
	writerErr := make(chan error, 1)
	wg.Go(func() {
		if err := migrateUntilDone(bg, store, log); err != nil {
			return
		}
		wg.Go(func() { scanDuplicates(bg, store, metrics, log) })
		w := analytics.NewDrainer(sp, store, analytics.DrainerOptions{Metrics: metrics, Parallel: o.InsertParallel, Logger: log.With("component", "writer")})
		if err := w.Run(bg); err != nil {
			// Without a writer the spool only fills up: stop, so that a
			// restart (which replays the spool) can recover.
			writerErr <- fmt.Errorf("spool writer: %w", err)
		}
	})
	if o.Retention > 0 {
		wg.Go(func() { retain(bg, store, o.Retention, metrics, log) })
	}
	var metricsSrv *http.Server
	if o.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{}))
		metricsSrv = &http.Server{Addr: o.MetricsListen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metricsSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics listener failed", "err", err)
			}
		}()
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("audit sink serving", "addr", ln.Addr().String(), "tls", tlsConfig != nil, "database", store.Database())
	if o.Ready != nil {
		o.Ready(ln.Addr())
	}

	select {
	case err = <-serveErr:
	case err = <-writerErr:
		log.Error("stopping: the spool writer failed", "err", err)
	case <-ctx.Done():
	}
	h.Drain()
	shutdownCtx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), 30*time.Second,
		errors.New("in-flight audit batches did not finish within 30s"))
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	if metricsSrv != nil {
		_ = metricsSrv.Shutdown(shutdownCtx)
	}
	stopBG()
	wg.Wait()
	log.Info("audit sink stopped")
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func serverTLS(o Options) (*tls.Config, error) {
	if o.Plaintext {
		if o.ClientCAFile != "" {
			return nil, errors.New("serve: client certificate authentication needs TLS")
		}
		return nil, nil
	}
	if o.TLSCertFile == "" || o.TLSKeyFile == "" {
		return nil, errors.New("serve: TLS needs a certificate and key (or pass the plaintext flag explicitly)")
	}
	cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if o.ClientCAFile != "" {
		pem, err := os.ReadFile(o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s holds no PEM certificates", o.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// migrateUntilDone applies the migrations, retrying while ClickHouse is
// away; the spool keeps accepting meanwhile.
func migrateUntilDone(ctx context.Context, store *analytics.Store, log *slog.Logger) error {
	return analytics.Retry(ctx, analytics.Backoff{}, log, "schema migration", nil, func() error {
		applied, err := store.Migrate(ctx)
		if err == nil && len(applied) > 0 {
			log.Info("schema migrated", "versions", applied)
		}
		return err
	})
}

// DuplicateScanDays is how far back serve's hourly scan for events stored
// more than once looks (Store.ScanDuplicates): the copies a writer killed
// between its insert and its check left unrecorded.
const DuplicateScanDays = 2

// scanDuplicates runs the duplicate scan now and then every hour.
func scanDuplicates(ctx context.Context, store *analytics.Store, m *analytics.Metrics, log *slog.Logger) {
	for {
		if err := store.ScanDuplicates(ctx, time.Now().AddDate(0, 0, -DuplicateScanDays)); err != nil && ctx.Err() == nil {
			m.CHErrors.Inc()
			log.Warn("duplicate scan failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Hour):
		}
	}
}

// retain drops expired day partitions now and then every hour.
func retain(ctx context.Context, store *analytics.Store, keep time.Duration, m *analytics.Metrics, log *slog.Logger) {
	for {
		dropped, err := store.DropPartitionsBefore(ctx, time.Now().Add(-keep))
		if err != nil && ctx.Err() == nil {
			m.CHErrors.Inc()
			log.Warn("retention failed", "err", err)
		} else if len(dropped) > 0 {
			log.Info("retention dropped day partitions", "days", dropped)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Hour):
		}
	}
}
