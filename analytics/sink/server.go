// Package sink is the HTTP endpoint for kube-apiserver's audit webhook
// backend: it authenticates the apiserver, splits each EventList body as a
// stream, appends the accepted events to the durable spool, and answers 200
// only after the spool's fsync. A background analytics.Drainer drains the
// spool into ClickHouse.
package sink

import (
	"compress/gzip"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/spool"
)

// DefaultMaxBodyBytes caps one request body: far above any apiserver batch
// (400 events of at most a few MiB each), so that only absurd bodies get a
// 413, which the apiserver would retry in vain.
const DefaultMaxBodyBytes = 1 << 30

// HandlerOptions configure the events handler.
type HandlerOptions struct {
	// Accepter decodes events; its Decoder and Stages apply.
	Accepter *analytics.Accepter
	// Spool receives the accepted records. Required.
	Spool *spool.Spool
	// Token, when not empty, is accepted as "Authorization: Bearer <Token>"
	// (compared in constant time).
	Token string
	// ClientCertAuth accepts requests that presented a client certificate
	// verified by the server's TLS config (its ClientCAs).
	ClientCertAuth bool
	// AllowUnauthenticated accepts every request. Only for plaintext tests
	// and trusted sidecars; New refuses a handler with no authentication
	// unless it is set.
	AllowUnauthenticated bool
	// DefaultCluster, when set, also serves POST /events for that cluster.
	DefaultCluster string
	// MaxBodyBytes caps a request body (compressed and decompressed);
	// defaulted to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxEventBytes caps one event; defaulted to
	// analytics.DefaultMaxEventBytes.
	MaxEventBytes int
	// RetryAfter is sent with 503 answers; defaulted to 5s.
	RetryAfter time.Duration
	Metrics    *analytics.Metrics
	Logger     *slog.Logger
}

// Handler serves the audit webhook endpoints.
type Handler struct {
	o        HandlerOptions
	mux      *http.ServeMux
	draining atomic.Bool
}

var clusterName = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$`)

// NewHandler checks the options and builds the routes:
// POST /clusters/{cluster}/events, POST /events (with DefaultCluster), and
// GET /healthz.
func NewHandler(o HandlerOptions) (*Handler, error) {
	if o.Spool == nil || o.Accepter == nil {
		return nil, errors.New("sink: a spool and an accepter are required")
	}
	if o.Token == "" && !o.ClientCertAuth && !o.AllowUnauthenticated {
		return nil, errors.New("sink: no authentication configured: give a bearer token, a client CA, or allow unauthenticated requests explicitly")
	}
	if o.DefaultCluster != "" && !clusterName.MatchString(o.DefaultCluster) {
		return nil, fmt.Errorf("sink: invalid cluster name %q", o.DefaultCluster)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxEventBytes <= 0 {
		o.MaxEventBytes = analytics.DefaultMaxEventBytes
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{o: o, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /clusters/{cluster}/events", h.events)
	if o.DefaultCluster != "" {
		h.mux.HandleFunc("POST /events", h.events)
	}
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return h, nil
}

// Drain makes the handler answer 503 to new batches, for a graceful
// shutdown: the apiserver retries them against another sink or later.
func (h *Handler) Drain() { h.draining.Store(true) }

// ServeHTTP implements http.Handler; a panic becomes a 500.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(p)
			}
			h.o.Logger.Error("panic serving audit batch", "err", fmt.Errorf("%v", p), "path", r.URL.Path)
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}()
	h.mux.ServeHTTP(w, r)
}

// Answer is the JSON body of a 200.
type Answer struct {
	Accepted int `json:"accepted"`
	Rejected int `json:"rejected"`
	Skipped  int `json:"skipped"`
}

func (h *Handler) authorized(r *http.Request) bool {
	if h.o.AllowUnauthenticated {
		return true
	}
	if h.o.ClientCertAuth && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	if h.o.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(got), []byte(h.o.Token)) == 1 {
			return true
		}
	}
	return false
}

// errTooLarge marks a body past MaxBodyBytes after decompression.
var errTooLarge = errors.New("request body too large")

type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	cluster := r.PathValue("cluster")
	if cluster == "" {
		cluster = h.o.DefaultCluster
	}
	log := h.o.Logger.With("cluster", cluster, "remote", r.RemoteAddr)
	if !h.authorized(r) {
		log.Warn("unauthenticated audit batch refused")
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if !clusterName.MatchString(cluster) {
		http.Error(w, "invalid cluster name", http.StatusBadRequest)
		return
	}
	if h.draining.Load() {
		h.unavailable(w, "shutting down")
		return
	}
	body := http.MaxBytesReader(w, r.Body, h.o.MaxBodyBytes)
	var src io.Reader
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
		var err error
		if src, err = analytics.MaybeGzip(body); err != nil {
			h.readError(w, log, err)
			return
		}
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			h.readError(w, log, err)
			return
		}
		src = zr
	default:
		http.Error(w, "unsupported Content-Encoding "+strconv.Quote(enc), http.StatusUnsupportedMediaType)
		return
	}
	src = &limitedReader{r: src, n: h.o.MaxBodyBytes}

	var spoolErr error
	items := analytics.NewListReader(src, h.o.MaxEventBytes)
	defer items.Release()
	res, err := h.o.Accepter.Accept(cluster, "webhook", items, func(rec []byte) error {
		_, spoolErr = h.o.Spool.Append([][]byte{rec})
		return spoolErr
	})
	switch {
	case err == nil:
	case spoolErr != nil && (errors.Is(spoolErr, spool.ErrFull) || errors.Is(spoolErr, spool.ErrClosed)):
		log.Warn("spool cannot take the batch; asking for a retry", "err", spoolErr)
		h.unavailable(w, spoolErr.Error())
		return
	case spoolErr != nil:
		log.Error("spool append failed", "err", spoolErr)
		http.Error(w, "spool: "+spoolErr.Error(), http.StatusInternalServerError)
		return
	default:
		h.readError(w, log, err)
		return
	}
	if res.Rejected > 0 {
		log.Warn("audit batch had invalid events; dead-lettered", "rejected", res.Rejected, "accepted", res.Accepted)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Answer{Accepted: res.Accepted, Rejected: res.Rejected, Skipped: res.Skipped})
}

func (h *Handler) readError(w http.ResponseWriter, log *slog.Logger, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || errors.Is(err, errTooLarge) {
		log.Warn("audit batch body over the limit", "limit", h.o.MaxBodyBytes)
		http.Error(w, "body larger than "+strconv.FormatInt(h.o.MaxBodyBytes, 10)+" bytes", http.StatusRequestEntityTooLarge)
		return
	}
	log.Warn("reading audit batch failed", "err", err)
	http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
}

func (h *Handler) unavailable(w http.ResponseWriter, why string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(h.o.RetryAfter.Round(time.Second)/time.Second)))
	http.Error(w, "unavailable: "+why, http.StatusServiceUnavailable)
}
