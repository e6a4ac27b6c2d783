package admission

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/stampguard/stampguard/internal/tlsserve"
	"github.com/stampguard/stampguard/policy"
)

// Bounds of the admission server's connections before a handler runs.
// controller-runtime's server allows 1 MiB of headers for 32 s per
// connection; reviews carry a few hundred bytes of headers.
const (
	reviewHeaderTimeout  = 10 * time.Second
	maxReviewHeaderBytes = 64 << 10
)

// The endpoints of the two webhooks: the stamp check (mutating) and the
// field rules (validating).
const (
	StampPath  = "/stamp"
	FieldsPath = "/fields"
)

// ServerOptions configure the admission server.
type ServerOptions struct {
	// Host and Port the server listens on (TLS).
	Host string
	Port int
	// CertDir holds tls.crt and tls.key; they are reloaded when they change.
	CertDir string
	// ClientCAFile, when set, makes the server require a client
	// certificate signed by a CA of this PEM bundle; it is reloaded when it
	// changes. Empty: no client certificate is asked for.
	ClientCAFile string
	// MaxReviewBytes bounds a review body. Defaults to DefaultMaxReviewBytes.
	MaxReviewBytes int64
	// MaxReviewBytesInFlight bounds the review bytes buffered across all
	// connections; at least twice MaxReviewBytes. Defaults to
	// DefaultMaxReviewBytesInFlight (or twice MaxReviewBytes, if more).
	MaxReviewBytesInFlight int64
	// ReviewReadTimeout bounds the time from a review's first byte to the
	// end of its body. Defaults to DefaultReviewReadTimeout.
	ReviewReadTimeout time.Duration
	// Metrics count the reviews and connections. Defaults to unregistered
	// ones.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server is the admission server: controller-runtime's webhook.Server,
// with the TLS of tlsserve (TLS >= 1.2, AEAD suites, HTTP/1.1, certificate
// and client CA reloaded from disk), tight header bounds, and a shutdown
// drain. Answer gives it its two endpoints.
type Server struct {
	addr    string
	tls     *tlsserve.Server
	mux     *http.ServeMux
	log     *slog.Logger
	metrics *Metrics
	limits  reviewLimits
	started atomic.Bool
}

var _ webhook.Server = (*Server)(nil)

// NewServer checks the review limits and loads the serving certificate;
// the server answers nothing until Answer is called.
func NewServer(o ServerOptions) (*Server, error) {
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	limits, err := newReviewLimits(o.MaxReviewBytes, o.MaxReviewBytesInFlight, o.ReviewReadTimeout)
	if err != nil {
		return nil, err
	}
	certs, err := tlsserve.New(tlsserve.Options{
		CertFile: filepath.Join(o.CertDir, "tls.crt"), KeyFile: filepath.Join(o.CertDir, "tls.key"),
		ClientCAFile: o.ClientCAFile, RequireClientCert: o.ClientCAFile != "",
	})
	if err != nil {
		return nil, fmt.Errorf("admission server TLS: %w", err)
	}
	// The server bounds each request's read (ReadTimeout, from its first
	// byte), so the handlers need not set a deadline per request.
	limits.serverDeadline = true
	return &Server{
		addr: net.JoinHostPort(o.Host, strconv.Itoa(o.Port)), tls: certs, mux: http.NewServeMux(),
		log: o.Logger, metrics: o.Metrics, limits: limits,
	}, nil
}

// Answer serves the stamp check at StampPath and the field rules at
// FieldsPath, with the policies src has in force, in env.
func (s *Server) Answer(src PolicySource, env *policy.Environment) {
	stamp, fields := handlers(src, env, s.metrics, s.log, s.limits)
	s.Register(StampPath, stamp)
	s.Register(FieldsPath, fields)
}

// NeedLeaderElection is false: every replica answers reviews.
func (s *Server) NeedLeaderElection() bool { return false }

// Register serves hook at path.
func (s *Server) Register(path string, hook http.Handler) { s.mux.Handle(path, hook) }

// WebhookMux is the server's mux.
func (s *Server) WebhookMux() *http.ServeMux { return s.mux }

// StartedChecker is healthy once the listener is open. It does not dial:
// with client certificates required, a probe without one would be refused
// and logged at every probe.
func (s *Server) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if !s.started.Load() {
			return errors.New("webhook server has not been started yet")
		}
		return nil
	}
}

// Start serves until ctx ends, then drains the reviews in flight (for up
// to a minute; the process may stop waiting sooner).
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return err
	}
	go func() {
		if err := s.tls.Start(ctx); err != nil {
			s.log.Error("the certificate watcher stopped; the serving certificate is no longer reloaded", "err", err)
		}
	}()
	srv := &http.Server{
		Handler:           s.mux,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: reviewHeaderTimeout,  // also bounds the TLS handshake
		ReadTimeout:       s.limits.readTimeout, // from the first byte to the end of the body
		MaxHeaderBytes:    maxReviewHeaderBytes,
		IdleTimeout:       90 * time.Second, // the apiserver's client keeps idle connections 90 s
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				s.metrics.connections.Inc()
			}
		},
	}
	closed := make(chan struct{})
	go func() {
		<-ctx.Done()
		s.log.Info("Shutting down webhook server")
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			s.log.Error("shutting down the webhook server", "err", err)
		}
		close(closed)
	}()
	s.started.Store(true)
	s.log.Info("Serving webhook server", "addr", ln.Addr().String())
	if err := srv.Serve(tls.NewListener(ln, s.tls.TLSConfig())); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-closed
	return nil
}
