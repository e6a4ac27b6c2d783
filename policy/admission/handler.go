package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

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

// handler serves one admission endpoint.
type handler struct {
	phase    phase
	source   PolicySource
	env      *policy.Environment
	metrics  *Metrics
	log      *slog.Logger
	maxBytes int64
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
	h.metrics.requests.WithLabelValues(endpoint).Inc()
	if r.Method != http.MethodPost {
		h.fail(w, endpoint, "method", http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed, use POST", r.Method))
		return
	}

	// The apiserver sends a Content-Length: a body declared too large is
	// refused before a byte of it is buffered.
	if r.ContentLength > h.maxBytes {
		h.fail(w, endpoint, "too_large", http.StatusRequestEntityTooLarge, fmt.Errorf("admission review of %d bytes is larger than %d bytes", r.ContentLength, h.maxBytes))
		return
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer putBuffer(buf)
	n, err := readReview(buf, r.Body, r.ContentLength, h.maxBytes)
	if err != nil {
		h.fail(w, endpoint, "read", http.StatusBadRequest, fmt.Errorf("read admission review: %w", err))
		return
	}
	if n > h.maxBytes {
		h.fail(w, endpoint, "too_large", http.StatusRequestEntityTooLarge, fmt.Errorf("admission review larger than %d bytes", h.maxBytes))
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
		h.fail(w, endpoint, "decode", http.StatusBadRequest, err)
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
		out = responseOut{UID: rv.uid, Status: &statusOut{
			Status: "Failure", Code: http.StatusBadRequest, Reason: "BadRequest",
			Message: "stampguard cannot evaluate this request: " + err.Error(),
		}}
	} else {
		out = answer(rv.uid, h.phase, d)
		h.record(r.Context(), &rv, endpoint, d, out.Allowed)
	}

	buf.Reset()
	enc := json.NewEncoder(buf)
	if err := enc.Encode(reviewOut{APIVersion: reviewAPIVersion, Kind: "AdmissionReview", Response: out}); err != nil {
		h.fail(w, endpoint, "encode", http.StatusInternalServerError, fmt.Errorf("encode admission response: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
	h.metrics.evaluation.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
}

// readReview reads body into buf, at most limit+1 bytes, so that a larger
// body shows as n > limit. The buffer is sized to a declared length at once;
// without one it doubles, but never past limit+1: bytes.Buffer's own growth
// would double a refused body's memory at the last step.
func readReview(buf *bytes.Buffer, body io.Reader, declared, limit int64) (n int64, err error) {
	if declared > 0 {
		buf.Grow(int(min(declared, limit)) + 1) // room to read the EOF
	}
	lr := io.LimitReader(body, limit+1)
	for {
		if int64(buf.Len()) > limit {
			return int64(buf.Len()), nil
		}
		if buf.Available() == 0 {
			next := int(min(max(2*int64(buf.Cap()), 4<<10), limit+1))
			grown := bytes.NewBuffer(make([]byte, 0, next))
			grown.Write(buf.Bytes())
			*buf = *grown
		}
		free := buf.AvailableBuffer()
		m, err := lr.Read(free[:cap(free)])
		buf.Write(free[:m]) // in place: free is buf's own spare capacity
		if err == io.EOF {
			return int64(buf.Len()), nil
		}
		if err != nil {
			return int64(buf.Len()), err
		}
	}
}

func putBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBuffer {
		bufPool.Put(buf)
	}
}

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
	// Denials are news; warnings and audits are counted and annotated already.
	level := slog.LevelDebug
	if !allowed {
		level = slog.LevelInfo
	}
	if h.log.Enabled(ctx, level) {
		msgs := make([]string, len(d.Violations))
		for i, v := range d.Violations {
			msgs[i] = v.Message
		}
		h.log.Log(ctx, level, "concurrency policy violated",
			h.requestAttrs(rv, endpoint, "outcome", outcome, "action", string(d.Action()), "violations", msgs)...)
	}
}

func (h *handler) requestAttrs(rv *review, endpoint string, more ...any) []any {
	r := &rv.req
	return append([]any{
		"endpoint", endpoint, "uid", rv.uid, "operation", string(r.Operation), "user", r.User.Name,
		"resource", resourceWithSub(r), "namespace", r.Namespace, "name", r.Name, "dryRun", r.DryRun,
	}, more...)
}

func resourceWithSub(r *policy.Request) string {
	s := r.Resource
	if r.Group != "" {
		s += "." + r.Group
	}
	if r.SubResource != "" {
		s += "/" + r.SubResource
	}
	return s
}

func (h *handler) fail(w http.ResponseWriter, endpoint, reason string, code int, err error) {
	h.metrics.errors.WithLabelValues(endpoint, reason).Inc()
	if !errors.Is(err, errNoRequest) {
		h.log.Warn("bad admission review", "endpoint", endpoint, "err", err)
	}
	http.Error(w, err.Error(), code)
}
