package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/policy"
)

// phase selects which rules an endpoint evaluates.
type phase string

const (
	// phaseStamp is the mutating endpoint: the only place where a missing
	// resourceVersion is still visible.
	phaseStamp phase = "stamp"
	// phaseFields is the validating endpoint: field owners, immutable
	// fields and delete preconditions.
	phaseFields phase = "fields"
)

// DefaultMaxReviewBytes bounds an AdmissionReview body. The apiserver refuses
// request bodies over 3 MiB, and a review carries the object and its old
// version (oldObject), so a real review stays under 2 x 3 MiB plus the
// request's envelope; 8 MiB leaves room and refuses anything larger.
const DefaultMaxReviewBytes = 8 << 20

// maxPooledBuffer is the largest buffer kept for reuse. Reviews are a few
// kilobytes; a buffer grown by a rare large one is left to the collector
// rather than held by the pool.
const maxPooledBuffer = 256 << 10

// PolicySource hands out the policy set in force. It must be cheap and safe
// for concurrent use; the set it returns is never modified.
type PolicySource interface {
	Policies() *policy.Set
}

// StaticSource serves a fixed policy set, as loaded from --policy-file.
type StaticSource struct{ set *policy.Set }

// NewStaticSource wraps a policy set.
func NewStaticSource(set *policy.Set) *StaticSource { return &StaticSource{set: set} }

// Policies returns the set.
func (s *StaticSource) Policies() *policy.Set { return s.set }

var _ PolicySource = (*StaticSource)(nil)

// handler serves one admission endpoint.
type handler struct {
	phase   phase
	source  PolicySource
	env     *policy.Environment
	metrics *Metrics
	log     *slog.Logger
	limits  reviewLimits
	// The endpoint's own series, looked up once rather than per request.
	requests   prometheus.Counter
	evaluation prometheus.Observer
	denials    logLimit
}

func newHandler(ph phase, src PolicySource, env *policy.Environment, m *Metrics, log *slog.Logger, limits reviewLimits) *handler {
	return &handler{
		phase: ph, source: src, env: env, metrics: m, log: log, limits: limits,
		requests:   m.requests.WithLabelValues(string(ph)),
		evaluation: m.evaluation.WithLabelValues(string(ph)),
	}
}

// Handlers builds the two admission endpoints over a policy source, for
// callers that mount them on a server of their own (and for benchmarks),
// with reviews of at most maxBytes (0: DefaultMaxReviewBytes), the default
// budget of bytes in flight and the default read timeout.
func Handlers(src PolicySource, env *policy.Environment, m *Metrics, log *slog.Logger, maxBytes int64) (stamp, fields http.Handler) {
	limits, err := newReviewLimits(maxBytes, 0, 0)
	if err != nil {
		panic(err) // unreachable: the default budget fits any maxBytes
	}
	return handlers(src, env, m, log, limits)
}

func handlers(src PolicySource, env *policy.Environment, m *Metrics, log *slog.Logger, limits reviewLimits) (stamp, fields http.Handler) {
	return newHandler(phaseStamp, src, env, m, log, limits), newHandler(phaseFields, src, env, m, log, limits)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	endpoint := string(h.phase)
	defer func() {
		if p := recover(); p != nil {
			h.metrics.errors.WithLabelValues(endpoint, "panic").Inc()
			h.log.Error("admission handler panicked", "endpoint", endpoint, "err", fmt.Errorf("panic: %v", p), "stack", string(debug.Stack()))
			http.Error(w, "internal error evaluating admission review", http.StatusInternalServerError)
		}
	}()
	h.requests.Inc()
	if r.Method != http.MethodPost {
		h.fail(w, endpoint, "method", http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed, use POST", r.Method))
		return
	}

	// The body must arrive within the read timeout, and its buffer is
	// charged to the budget shared by all requests: slow or oversized
	// bodies cannot add up to more memory than the budget.
	deadline := start.Add(h.limits.readTimeout)
	if !h.limits.serverDeadline {
		if err := http.NewResponseController(w).SetReadDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
			h.fail(w, endpoint, "read", http.StatusInternalServerError, fmt.Errorf("set the read deadline: %w", err))
			return
		}
	}
	ctx := r.Context()
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	charged := &chargedBuffer{buf: buf, budget: h.limits.budget, deadline: deadline}
	if r.ContentLength >= 0 {
		charged.reserve = r.ContentLength + 1
	}
	defer func() {
		charged.release()
		putBuffer(buf)
	}()
	if r.ContentLength > h.limits.maxBytes {
		// Refused before its body is buffered; its first bytes may still
		// name the request, so that the refusal is an answer.
		_, _ = readReview(ctx, charged, io.LimitReader(r.Body, uidPrefixBytes), uidPrefixBytes)
		h.refuse(w, endpoint, "too_large", reviewUID(buf.Bytes()), http.StatusRequestEntityTooLarge,
			fmt.Errorf("admission review of %d bytes is larger than %d bytes", r.ContentLength, h.limits.maxBytes))
		return
	}
	n, err := readReview(ctx, charged, r.Body, h.limits.maxBytes)
	if err != nil {
		reason, code := "read", http.StatusBadRequest
		switch {
		case errors.Is(err, errBudget):
			reason, code = "budget", http.StatusServiceUnavailable
		case errors.Is(err, os.ErrDeadlineExceeded):
			reason, code = "read_timeout", http.StatusRequestTimeout
			err = fmt.Errorf("the body did not arrive within %s: %w", h.limits.readTimeout, err)
		}
		w.Header().Set("Connection", "close")
		h.refuse(w, endpoint, reason, reviewUID(buf.Bytes()), code, fmt.Errorf("read admission review: %w", err))
		return
	}
	if n > h.limits.maxBytes {
		h.refuse(w, endpoint, "too_large", reviewUID(buf.Bytes()), http.StatusRequestEntityTooLarge,
			fmt.Errorf("admission review larger than %d bytes", h.limits.maxBytes))
		return
	}

	set := h.source.Policies()
	if set == nil {
		// Not serving an empty set keeps failurePolicy in charge until the
		// policies are known.
		h.fail(w, endpoint, "not_ready", http.StatusServiceUnavailable, errors.New("policies not loaded yet"))
		return
	}
	rv, err := decodeReview(buf.Bytes(), set)
	if err != nil {
		h.refuse(w, endpoint, "decode", reviewUID(buf.Bytes()), http.StatusBadRequest, err)
		return
	}
	var d policy.Decision
	if h.phase == phaseStamp {
		d, err = set.CheckStamp(&rv.req, h.env)
	} else {
		d, err = set.CheckFields(&rv.req, h.env)
	}
	var out responseOut
	if err != nil {
		// The apiserver never sends objects we cannot read; if one arrives,
		// refuse it with the reason rather than guess.
		h.metrics.errors.WithLabelValues(endpoint, "evaluate").Inc()
		h.log.Warn("cannot evaluate admission request", h.requestAttrs(&rv, endpoint, "err", err)...)
		out = cannotEvaluate(rv.uid, http.StatusBadRequest, err)
	} else {
		out = answer(rv.uid, h.phase, d)
		if out.Status != nil && out.Status.Details != nil {
			// The object, named as the apiserver's own 422 names it.
			out.Status.Details.Name, out.Status.Details.Group, out.Status.Details.Kind = rv.req.Name, rv.kindGroup, rv.kind
		}
		h.record(ctx, &rv, endpoint, d, out.Allowed)
	}

	// The review's buffer is free again: the answer is written into it.
	buf.Reset()
	body := appendReview(buf.AvailableBuffer(), &out)
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(body)
	h.evaluation.Observe(time.Since(start).Seconds())
}

// jsonContentType is set as is: Header().Set would canonicalize the key
// and allocate the slice on every answer.
var jsonContentType = []string{"application/json"}

func putBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBuffer {
		bufPool.Put(buf)
	}
}

// record counts a decision's violations and logs them. Every violation is
// counted (stampguard_admission_decisions_total) and annotated in the
// audit log. Denials are news and logged at info, but at most
// denialLinesPerSecond lines a second per endpoint: a refused writer in a
// conflict storm retries thousands of times a second, and a line for each
// would cost more CPU than the decision (BENCHMARKS.md). The next line
// logged says how many denials went unlogged before it. At debug level
// every denial is logged, and warnings and audits too.
func (h *handler) record(ctx context.Context, rv *review, endpoint string, d policy.Decision, allowed bool) {
	if len(d.Violations) == 0 {
		return
	}
	outcome := "allowed"
	if !allowed {
		outcome = "denied"
	}
	for _, v := range d.Violations {
		h.metrics.decisions.WithLabelValues(endpoint, v.Policy, string(v.Rule), string(v.Action), outcome).Inc()
	}
	level := slog.LevelDebug
	var more []any
	if !allowed {
		level = slog.LevelInfo
		if !h.log.Enabled(ctx, slog.LevelDebug) {
			ok, unlogged := h.denials.allow(time.Now())
			if !ok {
				return
			}
			if unlogged > 0 {
				more = []any{"unloggedDenials", unlogged}
			}
		}
	}
	if h.log.Enabled(ctx, level) {
		msgs := make([]string, len(d.Violations))
		for i, v := range d.Violations {
			msgs[i] = v.Message
		}
		h.log.Log(ctx, level, "concurrency policy violated",
			h.requestAttrs(rv, endpoint, append([]any{"outcome", outcome, "action", string(d.Action()), "violations", msgs}, more...)...)...)
	}
}

// denialLinesPerSecond bounds the info lines of denials per endpoint.
const denialLinesPerSecond = 10

// logLimit admits up to denialLinesPerSecond lines in each second and
// counts the rest.
type logLimit struct {
	mu       sync.Mutex
	second   int64 // Unix second of the current window
	lines    int   // admitted in it
	unlogged int   // refused since the last admitted line
}

// allow reports whether a line may be logged now and, if so, how many
// were refused since the last one.
func (l *logLimit) allow(now time.Time) (ok bool, unlogged int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := now.Unix(); s != l.second {
		l.second, l.lines = s, 0
	}
	if l.lines >= denialLinesPerSecond {
		l.unlogged++
		return false, 0
	}
	l.lines++
	unlogged, l.unlogged = l.unlogged, 0
	return true, unlogged
}

func (h *handler) requestAttrs(rv *review, endpoint string, more ...any) []any {
	r := &rv.req
	return append([]any{
		"endpoint", endpoint, "uid", rv.uid, "operation", string(r.Operation), "user", r.User.Name,
		"resource", r.ResourceName(), "namespace", r.Namespace, "name", r.Name, "dryRun", r.DryRun,
	}, more...)
}

// cannotEvaluate is the denial of a review the webhook cannot evaluate.
// An HTTP error would leave the request to failurePolicy, and Ignore would
// let it through: an answer denies it, naming the reason.
func cannotEvaluate(uid string, code int, err error) responseOut {
	reason := metav1.StatusReasonBadRequest
	switch code {
	case http.StatusRequestEntityTooLarge:
		reason = metav1.StatusReasonRequestEntityTooLarge
	case http.StatusRequestTimeout:
		reason = metav1.StatusReasonTimeout
	case http.StatusServiceUnavailable:
		reason = metav1.StatusReasonServiceUnavailable
	}
	return responseOut{UID: uid, Status: &statusOut{
		Status: "Failure", Code: int32(code), Reason: reason,
		Message: "stampguard cannot evaluate this request: " + err.Error(),
	}}
}

// refuse answers a review that could not be read or decoded: with a
// denial when its uid is known (the apiserver matches answers by uid),
// else with the HTTP error code, which the apiserver treats as a call
// failure (failurePolicy). The apiserver itself never sends a review
// without a readable uid.
func (h *handler) refuse(w http.ResponseWriter, endpoint, reason, uid string, code int, err error) {
	if uid == "" {
		h.fail(w, endpoint, reason, code, err)
		return
	}
	h.metrics.errors.WithLabelValues(endpoint, reason).Inc()
	h.log.Warn("admission review denied: it cannot be evaluated", "endpoint", endpoint, "uid", uid, "reason", reason, "err", err)
	out := cannotEvaluate(uid, code, err)
	w.Header()["Content-Type"] = jsonContentType
	_, _ = w.Write(appendReview(nil, &out))
}

func (h *handler) fail(w http.ResponseWriter, endpoint, reason string, code int, err error) {
	h.metrics.errors.WithLabelValues(endpoint, reason).Inc()
	if !errors.Is(err, errNoRequest) {
		h.log.Warn("bad admission review", "endpoint", endpoint, "err", err)
	}
	http.Error(w, err.Error(), code)
}
