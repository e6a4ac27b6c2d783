// Package sink is the HTTP endpoint for kube-apiserver's audit webhook
// backend: it authenticates the apiserver, splits each EventList body as a
// stream, appends the accepted events to the durable spool, and answers 200
// only after the spool's fsync. In the background, pipeline.DrainSpool
// stores the spool in ClickHouse (run.go wires the two).
package sink

import (
	"compress/gzip"
	"context"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/spool"
	"github.com/stampguard/stampguard/internal/audit"
)

// DefaultMaxBodyBytes caps one request body: far above any apiserver batch
// (400 events of at most a few MiB each), so that only absurd bodies get a
// 413, which the apiserver would retry in vain.
const DefaultMaxBodyBytes = 1 << 30

// DefaultCluster is the cluster name of POST /events, and of ingest and
// tail without --cluster.
const DefaultCluster = "default"

// Defaults of the body read deadline (HandlerOptions.BodyGrace and
// BodyMinRate): a body must arrive at 64 KiB/s on average after a 10 s
// grace, so a 1 GiB body may take 4.5 hours but a client sending a byte a
// second is cut after about 10 s.
const (
	DefaultBodyGrace   = 10 * time.Second
	DefaultBodyMinRate = 64 << 10
)

// HandlerOptions configure the events handler.
type HandlerOptions struct {
	// Accepter decodes events; its Decoder and Stages apply.
	Accepter *pipeline.Accepter
	// Spool receives the accepted records. Required.
	Spool *spool.Spool
	// Token, when not empty, is accepted as "Authorization: Bearer <Token>"
	// (compared in constant time).
	Token string
	// TokenClusters are the clusters the token may write; empty: any.
	TokenClusters []string
	// VerifyClient, when set, checks a client certificate chain (for
	// client authentication against the client CA in force). The TLS
	// handshake only requests a certificate (tls.RequestClientCert) and
	// the handler verifies it, so a certificate from an unknown CA (during
	// a CA rotation) does not fail the handshake, and a valid token still
	// suffices.
	VerifyClient func([]*x509.Certificate) error
	// ClientNames is the allow-list of client certificates: a verified
	// certificate is accepted only when its Common Name or one of its DNS
	// names is a key here, and then for the clusters of that key (none:
	// any cluster). Required with VerifyClient: a CA such as the cluster
	// CA also signs kubelet and user certificates.
	ClientNames map[string][]string
	// AllowUnauthenticated accepts every request. Only for plaintext tests
	// and trusted sidecars; New refuses a handler with no authentication
	// unless it is set.
	AllowUnauthenticated bool
	// DefaultCluster is the cluster of POST /events; defaulted to
	// DefaultCluster ("default").
	DefaultCluster string
	// MaxBodyBytes caps a request body (compressed and decompressed);
	// defaulted to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxEventBytes caps one event; defaulted to
	// audit.DefaultMaxEventBytes.
	MaxEventBytes int
	// RetryAfter is sent with 503 answers; defaulted to 5s.
	RetryAfter time.Duration
	// BodyGrace and BodyMinRate bound the time a body may take: after
	// BodyGrace it must have arrived at BodyMinRate bytes/s on average,
	// else the connection is cut. Defaulted to DefaultBodyGrace (10s) and
	// DefaultBodyMinRate (64 KiB/s).
	BodyGrace   time.Duration
	BodyMinRate int64
	// Metrics, when set, counts the accepted events and the refused
	// batches (by reason); nil counts nothing.
	Metrics *pipeline.Metrics
	// Logger receives the handler's warnings; nil discards them.
	Logger *slog.Logger
}

// Handler serves the audit webhook endpoints.
type Handler struct {
	o        HandlerOptions
	mux      *http.ServeMux
	draining atomic.Bool
	// full is the spool's size on disk when it last refused a batch for
	// being full (0: it has not, or has shrunk since); closed, that the
	// spool refused one for being closed. Both fail /readyz.
	full   atomic.Int64
	closed atomic.Bool

	mu       sync.Mutex
	inflight map[*pacedBody]struct{} // bodies being read
	active   int                     // requests in the events handler
	idle     chan struct{}           // closed when active drops to 0
	cutAt    time.Time               // set by CutBodies
}

var clusterName = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$`)

// IsClusterName tells whether name may name a source cluster: letters,
// digits, '-', '_' and '.', starting with a letter or digit, at most 63.
func IsClusterName(name string) bool { return clusterName.MatchString(name) }

// NewHandler checks the options and builds the routes:
// POST /clusters/{cluster}/events, POST /events (for DefaultCluster),
// GET /healthz (the process answers: liveness) and GET /readyz (it takes
// batches: 503 while it drains for a shutdown, and from a refusal for a
// full spool until the spool has shrunk, so that the Service sends the
// apiserver's batches to other replicas meanwhile).
func NewHandler(o HandlerOptions) (*Handler, error) {
	if o.Spool == nil || o.Accepter == nil {
		return nil, errors.New("sink: a spool and an accepter are required")
	}
	if o.Token == "" && o.VerifyClient == nil && !o.AllowUnauthenticated {
		return nil, errors.New("sink: no authentication configured: give a bearer token, a client CA, or allow unauthenticated requests explicitly")
	}
	if o.VerifyClient != nil && len(o.ClientNames) == 0 {
		return nil, errors.New("sink: client certificates need an allow-list of their names (ClientNames)")
	}
	for name, clusters := range o.ClientNames {
		for _, c := range clusters {
			if !clusterName.MatchString(c) {
				return nil, fmt.Errorf("sink: client name %q: invalid cluster name %q", name, c)
			}
		}
	}
	for _, c := range o.TokenClusters {
		if !clusterName.MatchString(c) {
			return nil, fmt.Errorf("sink: token: invalid cluster name %q", c)
		}
	}
	if o.DefaultCluster == "" {
		o.DefaultCluster = DefaultCluster
	}
	if !clusterName.MatchString(o.DefaultCluster) {
		return nil, fmt.Errorf("sink: invalid cluster name %q", o.DefaultCluster)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxEventBytes <= 0 {
		o.MaxEventBytes = audit.DefaultMaxEventBytes
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = 5 * time.Second
	}
	if o.BodyGrace <= 0 {
		o.BodyGrace = DefaultBodyGrace
	}
	if o.BodyMinRate <= 0 {
		o.BodyMinRate = DefaultBodyMinRate
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{o: o, mux: http.NewServeMux(), inflight: map[*pacedBody]struct{}{}, idle: make(chan struct{})}
	close(h.idle)
	h.mux.HandleFunc("POST /clusters/{cluster}/events", h.events)
	h.mux.HandleFunc("POST /events", h.events)
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	h.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := h.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return h, nil
}

// Ready reports why the handler would refuse batches now, or nil.
func (h *Handler) Ready() error {
	if h.draining.Load() || h.closed.Load() {
		return errors.New("shutting down")
	}
	if at := h.full.Load(); at > 0 {
		if h.o.Spool.Stats().BytesOnDisk >= at {
			return errors.New("the spool was full and has not shrunk since")
		}
		h.full.CompareAndSwap(at, 0)
	}
	return nil
}

// Drain makes the handler answer 503 to new batches, for a graceful
// shutdown: the apiserver retries them against another sink or later.
func (h *Handler) Drain() { h.draining.Store(true) }

// CutBodies makes the bodies still arriving fail at deadline (and the
// bodies of requests that start later too): at shutdown, a slow client
// must not hold the process past its grace period.
func (h *Handler) CutBodies(deadline time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cutAt = deadline
	for b := range h.inflight {
		b.cut(deadline)
	}
}

// Wait returns once no request is in the events handler, or with ctx's
// error.
func (h *Handler) Wait(ctx context.Context) error {
	h.mu.Lock()
	idle := h.idle
	h.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (h *Handler) enter() {
	h.mu.Lock()
	if h.active == 0 {
		h.idle = make(chan struct{})
	}
	h.active++
	h.mu.Unlock()
}

func (h *Handler) leave() {
	h.mu.Lock()
	if h.active--; h.active == 0 {
		close(h.idle)
	}
	h.mu.Unlock()
}

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

// authorize decides whether r may write to cluster, before its body is
// read: 0 when it may, else 401 (no valid credential) or 403 (a valid
// credential not allowed here: a certificate whose name is not on the
// allow-list, or an identity bound to other clusters). why says what was
// refused, for the log.
func (h *Handler) authorize(r *http.Request, cluster string) (code int, why string) {
	if h.o.AllowUnauthenticated {
		return 0, ""
	}
	code, why = http.StatusUnauthorized, "no valid credential"
	if h.o.VerifyClient != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && h.o.VerifyClient(r.TLS.PeerCertificates) == nil {
		cert := r.TLS.PeerCertificates[0]
		name, clusters, ok := h.clientName(cert)
		switch {
		case !ok:
			code, why = http.StatusForbidden, fmt.Sprintf("client certificate %q is not on the allow-list of names", cert.Subject.CommonName)
		case mayWrite(clusters, cluster):
			return 0, ""
		default:
			code, why = http.StatusForbidden, fmt.Sprintf("client certificate %q may not write cluster %q", name, cluster)
		}
	}
	if h.o.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(got), []byte(h.o.Token)) == 1 {
			if mayWrite(h.o.TokenClusters, cluster) {
				return 0, ""
			}
			code, why = http.StatusForbidden, fmt.Sprintf("the token may not write cluster %q", cluster)
		}
	}
	return code, why
}

// clientName finds cert's Common Name or one of its DNS names in the
// allow-list.
func (h *Handler) clientName(cert *x509.Certificate) (name string, clusters []string, ok bool) {
	for _, n := range append([]string{cert.Subject.CommonName}, cert.DNSNames...) {
		if clusters, ok := h.o.ClientNames[n]; ok && n != "" {
			return n, clusters, true
		}
	}
	return "", nil, false
}

// mayWrite reports whether an identity bound to clusters (none: any) may
// write cluster.
func mayWrite(clusters []string, cluster string) bool {
	return len(clusters) == 0 || slices.Contains(clusters, cluster)
}

// Errors of a body cut by its read deadline.
var (
	errBodyTooSlow  = errors.New("body arrived too slowly")
	errBodyShutdown = errors.New("body still arriving at shutdown")
)

// pacedBody bounds the time a body takes to arrive: before each read it
// sets the connection's read deadline to start + grace + read/minRate, or
// the shutdown's cut if that is earlier.
type pacedBody struct {
	r     io.Reader
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int64
	n     int64

	mu    sync.Mutex
	cutAt time.Time
	read  bool // the body's end was read; no more deadlines
}

func (p *pacedBody) deadline() (time.Time, bool) {
	d := p.start.Add(p.grace + time.Duration(float64(p.n)/float64(p.rate)*float64(time.Second)))
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cutAt.IsZero() && p.cutAt.Before(d) {
		return p.cutAt, true
	}
	return d, false
}

func (p *pacedBody) cut(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAt = at
	if !p.read {
		_ = p.rc.SetReadDeadline(at)
	}
}

func (p *pacedBody) Read(b []byte) (int, error) {
	p.mu.Lock()
	read := p.read
	p.mu.Unlock()
	if read {
		return 0, io.EOF
	}
	d, _ := p.deadline()
	if err := p.rc.SetReadDeadline(d); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return 0, err
	}
	// A cut that came between deadline() and SetReadDeadline must win.
	if d2, cut := p.deadline(); cut && d2 != d {
		_ = p.rc.SetReadDeadline(d2)
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	if errors.Is(err, io.EOF) {
		// All of it is here: the rest of the request (the spool append)
		// is bounded elsewhere, and the server's read of the next request
		// sets its own deadline.
		p.mu.Lock()
		p.read = true
		_ = p.rc.SetReadDeadline(time.Time{})
		p.mu.Unlock()
		return n, err
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		if _, cut := p.deadline(); cut {
			return n, fmt.Errorf("%w (%d bytes read)", errBodyShutdown, p.n)
		}
		return n, fmt.Errorf("%w: %d bytes in %s, below %d bytes/s after %s", errBodyTooSlow, p.n,
			time.Since(p.start).Round(time.Millisecond), p.rate, p.grace)
	}
	return n, err
}

func (h *Handler) pace(w http.ResponseWriter, r *http.Request) *pacedBody {
	p := &pacedBody{r: r.Body, rc: http.NewResponseController(w), start: time.Now(),
		grace: h.o.BodyGrace, rate: h.o.BodyMinRate}
	h.mu.Lock()
	p.cutAt = h.cutAt
	h.inflight[p] = struct{}{}
	h.mu.Unlock()
	return p
}

// unpace forgets p. It leaves the read deadline in place: the server reads
// what is left of an unread body after the handler (to reuse the
// connection), and that read must be bounded too. It sets its own
// deadlines for the next request.
func (h *Handler) unpace(p *pacedBody) {
	h.mu.Lock()
	delete(h.inflight, p)
	h.mu.Unlock()
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
	h.enter()
	defer h.leave()
	cluster := r.PathValue("cluster")
	if cluster == "" {
		cluster = h.o.DefaultCluster
	}
	log := h.o.Logger.With("cluster", cluster, "remote", r.RemoteAddr)
	if !clusterName.MatchString(cluster) {
		h.refuse(pipeline.RefusedBadRequest)
		http.Error(w, "invalid cluster name", http.StatusBadRequest)
		return
	}
	if code, why := h.authorize(r, cluster); code != 0 {
		log.Warn("audit batch refused", "status", code, "why", why)
		h.refuse(pipeline.RefusedUnauthorized)
		http.Error(w, http.StatusText(code)+": "+why, code)
		return
	}
	if h.draining.Load() {
		h.refuse(pipeline.RefusedShutdown)
		w.Header().Set("Connection", "close")
		h.unavailable(w, "shutting down")
		return
	}
	paced := h.pace(w, r)
	defer h.unpace(paced)
	body := http.MaxBytesReader(w, io.NopCloser(paced), h.o.MaxBodyBytes)
	var src io.Reader
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
		var err error
		if src, err = audit.MaybeGzip(body); err != nil {
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
		h.refuse(pipeline.RefusedBadRequest)
		http.Error(w, "unsupported Content-Encoding "+strconv.Quote(enc), http.StatusUnsupportedMediaType)
		return
	}
	src = &limitedReader{r: src, n: h.o.MaxBodyBytes}

	var spoolErr error
	items := audit.NewListReader(src, h.o.MaxEventBytes)
	defer items.Release()
	// The batch's conflict signals are counted as each event is decoded
	// and committed only with the 200, so a refused batch that the
	// apiserver sends again counts once.
	tally := tallies.Get().(*pipeline.Tally)
	defer func() { tally.Reset(); tallies.Put(tally) }()
	res, err := h.o.Accepter.AcceptTally(cluster, "webhook", items, tally, func(rec []byte) error {
		_, spoolErr = h.o.Spool.Append([][]byte{rec})
		return spoolErr
	})
	switch {
	case err == nil:
	case spoolErr != nil && errors.Is(spoolErr, spool.ErrFull):
		log.Warn("spool cannot take the batch; asking for a retry", "err", spoolErr)
		h.full.Store(max(1, h.o.Spool.Stats().BytesOnDisk))
		h.refuse(pipeline.RefusedSpoolFull)
		h.unavailable(w, spoolErr.Error())
		return
	case spoolErr != nil && errors.Is(spoolErr, spool.ErrClosed):
		log.Warn("spool closed; asking for a retry", "err", spoolErr)
		h.closed.Store(true)
		h.refuse(pipeline.RefusedShutdown)
		h.unavailable(w, spoolErr.Error())
		return
	case spoolErr != nil:
		log.Error("spool append failed", "err", spoolErr)
		h.refuse(pipeline.RefusedSpoolError)
		http.Error(w, "spool: "+spoolErr.Error(), http.StatusInternalServerError)
		return
	default:
		h.readError(w, log, err)
		return
	}
	h.o.Metrics.CountAccepted("webhook", res)
	h.o.Metrics.CountSignals(cluster, tally)
	if res.Rejected > 0 {
		log.Warn("audit batch had invalid events; dead-lettered", "rejected", res.Rejected, "accepted", res.Accepted)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Answer{Accepted: res.Accepted, Rejected: res.Rejected, Skipped: res.Skipped})
}

var tallies = sync.Pool{New: func() any { return pipeline.NewTally() }}

func (h *Handler) refuse(reason string) {
	if h.o.Metrics != nil {
		h.o.Metrics.BatchesRefused.WithLabelValues(reason).Inc()
	}
}

func (h *Handler) readError(w http.ResponseWriter, log *slog.Logger, err error) {
	var mbe *http.MaxBytesError
	var env *audit.EnvelopeError
	switch {
	case errors.As(err, &mbe) || errors.Is(err, errTooLarge):
		log.Warn("audit batch body over the limit", "limit", h.o.MaxBodyBytes)
		h.refuse(pipeline.RefusedTooLarge)
		http.Error(w, "body larger than "+strconv.FormatInt(h.o.MaxBodyBytes, 10)+" bytes", http.StatusRequestEntityTooLarge)
	case errors.As(err, &env):
		log.Warn("audit batch refused: not an EventList", "err", err)
		h.refuse(pipeline.RefusedBadRequest)
		http.Error(w, err.Error(), http.StatusBadRequest)
	case errors.Is(err, errBodyTooSlow):
		log.Warn("audit batch body arrived too slowly; connection cut", "err", err)
		h.refuse(pipeline.RefusedTooSlow)
		w.Header().Set("Connection", "close")
		http.Error(w, "read body: "+err.Error(), http.StatusRequestTimeout)
	case errors.Is(err, errBodyShutdown):
		log.Warn("audit batch body still arriving at shutdown; connection cut", "err", err)
		h.refuse(pipeline.RefusedShutdown)
		w.Header().Set("Connection", "close")
		h.unavailable(w, "shutting down")
	default:
		log.Warn("reading audit batch failed", "err", err)
		h.refuse(pipeline.RefusedBadRequest)
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
	}
}

func (h *Handler) unavailable(w http.ResponseWriter, why string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(h.o.RetryAfter.Round(time.Second)/time.Second)))
	http.Error(w, "unavailable: "+why, http.StatusServiceUnavailable)
}
