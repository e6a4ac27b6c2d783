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
	// Listen is the HTTPS (or plaintext) address; defaulted to DefaultListen (":8443").
	Listen string
	// TLSCertFile and TLSKeyFile serve TLS. Required unless Plaintext.
	TLSCertFile, TLSKeyFile string
	// Plaintext serves HTTP without TLS. Off by default.
	Plaintext bool
	// ClientCAFile, when set, verifies client certificates against this CA
	// bundle and accepts requests that present a valid one. The handshake
	// does not require one: a request with a valid token passes with any
	// certificate or none.
	ClientCAFile string
	// Token accepts "Authorization: Bearer <Token>".
	Token string
	// AllowUnauthenticated accepts requests without credentials.
	AllowUnauthenticated bool
	// Cluster is the cluster of POST /events; defaulted to DefaultCluster
	// ("default").
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
	// audit.DefaultMaxEventBytes.
	MaxBodyBytes  int64
	MaxEventBytes int
	// Retention drops day partitions older than this (0 keeps all).
	Retention time.Duration
	// InsertParallel is the number of ClickHouse inserts in flight;
	// defaulted by analytics.DrainerOptions.
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

// DefaultShutdownTimeout is Options.ShutdownTimeout's default: below the
// 30 s default terminationGracePeriodSeconds of a pod, so that a SIGTERM
// never ends in a SIGKILL.
const DefaultShutdownTimeout = 20 * time.Second

// Run serves until ctx is done: it opens the spool (replaying what was not
// confirmed), starts the writer (which applies the migrations first, and
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
		return errors.New("serve: a spool directory is required")
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
		o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	tlsConfig, clientCAs, err := serverTLS(o)
	if err != nil {
		return err
	}
	metrics := analytics.NewMetrics(o.Registry)
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
	store, err := analytics.OpenStore(ctx, o.Store)
	if err != nil {
		return err
	}
	defer store.Close()

	h, err := NewHandler(HandlerOptions{
		Accepter: newAccepter(o.Stages, o.RedactResources, o.Store.KeepRaw),
		Spool:    sp, Token: o.Token, ClientCAs: clientCAs,
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
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	// No ReadTimeout: the handler bounds each body by its size (see
	// HandlerOptions.BodyMinRate), so a 1 GiB body is not cut while a
	// slow one is.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: o.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	// The writer's inserts in flight at shutdown finish, with their checks
	// for concurrent copies, until the shutdown deadline.
	finish, stopFinish := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFinish()
	var wg sync.WaitGroup
	writerErr := make(chan error, 1)
	wg.Go(func() {
		if err := migrateUntilDone(bg, store, metrics, log); err != nil {
			return
		}
		wg.Go(func() { scanDuplicates(bg, store, metrics, log) })
		wg.Go(func() { analytics.ScanWhilePending(bg, store, pendingScanEvery, metrics, log) })
		w := analytics.NewDrainer(sp, store, analytics.DrainerOptions{Metrics: metrics, Parallel: o.InsertParallel, Finish: finish,
			Logger: log.With("component", "writer")})
		if err := w.Run(bg); err != nil {
			// Without a writer the spool only fills up: stop, so that a
			// restart (which replays the spool) can recover.
			writerErr <- fmt.Errorf("spool writer: %w", err)
		}
	})
	if o.Retention > 0 {
		wg.Go(func() { retain(bg, store, o.Retention, metrics, log) })
	}
	stopMetrics := func(context.Context) {}
	if o.MetricsListen != "" {
		stopMetrics = ServeMetrics(o.MetricsListen, o.Registry, log)
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

// serverTLS builds the listener's TLS config and the client CA pool the
// handler verifies certificates with. The handshake only requests a client
// certificate and names no acceptable CAs, so that a client sends its
// certificate whatever its CA, and a certificate the handler cannot verify
// still leaves the token to decide.
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

func serverTLS(o Options) (*tls.Config, *x509.CertPool, error) {
	if o.Plaintext {
		if o.ClientCAFile != "" {
			return nil, nil, errors.New("serve: client certificate authentication needs TLS")
		}
		return nil, nil, nil
	}
	if o.TLSCertFile == "" || o.TLSKeyFile == "" {
		return nil, nil, errors.New("serve: TLS needs a certificate and key (or pass the plaintext flag explicitly)")
	}
	cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if o.ClientCAFile == "" {
		return cfg, nil, nil
	}
	pem, err := os.ReadFile(o.ClientCAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("read client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("client CA %s holds no PEM certificates", o.ClientCAFile)
	}
	cfg.ClientAuth = tls.RequestClientCert
	return cfg, pool, nil
}

// migrateUntilDone applies the migrations, retrying while ClickHouse is
// away; the spool keeps accepting meanwhile.
func migrateUntilDone(ctx context.Context, store *analytics.Store, m *analytics.Metrics, log *slog.Logger) error {
	return analytics.Retry(ctx, analytics.Backoff{}, log, "schema migration", func(err error) {
		m.CountCHError(analytics.OpMigrate, err)
	}, func() error {
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

// pendingScanEvery is how often serve looks for a scan that a check left
// pending while a ClickHouse node was down (Store.ScanPending). While the
// node is down the scan fails at once; it runs whole once, after the node
// is back.
const pendingScanEvery = 15 * time.Second

// scanDuplicates runs the duplicate scan now and then every hour.
func scanDuplicates(ctx context.Context, store *analytics.Store, m *analytics.Metrics, log *slog.Logger) {
	for {
		if err := store.ScanDuplicates(ctx, time.Now().AddDate(0, 0, -DuplicateScanDays)); err != nil && ctx.Err() == nil {
			m.CountCHError(analytics.OpScan, err)
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
			m.CountCHError(analytics.OpRetention, err)
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
