package admission

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/stampguard/stampguard/internal/tlsserve"
)

// Bounds of the admission server's connections before a handler runs.
// controller-runtime's server allows 1 MiB of headers for 32 s per
// connection; reviews carry a few hundred bytes of headers.
const (
	reviewHeaderTimeout  = 10 * time.Second
	maxReviewHeaderBytes = 64 << 10
)

// reviewServer is the admission server: controller-runtime's
// webhook.Server, with the TLS of tlsserve (TLS >= 1.2, AEAD suites,
// HTTP/1.1, certificate and client CA reloaded from disk), tight header
// bounds, and the shutdown drain Run expects.
type reviewServer struct {
	addr  string
	tls   *tlsserve.Server
	mux   *http.ServeMux
	log   *slog.Logger
	conns prometheus.Counter // accepted connections
	// readTimeout bounds a request from its first byte to the end of its
	// body (http.Server.ReadTimeout).
	readTimeout time.Duration
	started     atomic.Bool
}

var _ webhook.Server = (*reviewServer)(nil)

func newReviewServer(host string, port int, t *tlsserve.Server, log *slog.Logger, conns prometheus.Counter, readTimeout time.Duration) *reviewServer {
	return &reviewServer{addr: net.JoinHostPort(host, strconv.Itoa(port)), tls: t, mux: http.NewServeMux(), log: log, conns: conns, readTimeout: readTimeout}
}

// NeedLeaderElection is false: every replica answers reviews.
func (s *reviewServer) NeedLeaderElection() bool { return false }

// Register serves hook at path.
func (s *reviewServer) Register(path string, hook http.Handler) { s.mux.Handle(path, hook) }

// WebhookMux is the server's mux.
func (s *reviewServer) WebhookMux() *http.ServeMux { return s.mux }

// StartedChecker is healthy once the listener is open. It does not dial:
// with client certificates required, a probe without one would be refused
// and logged at every probe.
func (s *reviewServer) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if !s.started.Load() {
			return errors.New("webhook server has not been started yet")
		}
		return nil
	}
}

// Start serves until ctx ends, then drains the reviews in flight (for up
// to a minute; Run's ShutdownTimeout is shorter and wins).
func (s *reviewServer) Start(ctx context.Context) error {
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
		ReadHeaderTimeout: reviewHeaderTimeout, // also bounds the TLS handshake
		ReadTimeout:       s.readTimeout,
		MaxHeaderBytes:    maxReviewHeaderBytes,
		IdleTimeout:       90 * time.Second, // the apiserver's client keeps idle connections 90 s
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				s.conns.Inc()
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
