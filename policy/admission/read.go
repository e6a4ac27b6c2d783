package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// DefaultMaxReviewBytesInFlight bounds the review bytes buffered at once
// across all connections: four reviews at the DefaultMaxReviewBytes limit,
// or thousands of real ones (a review is a few kilobytes). With it the
// webhook's memory stays below its baseline plus this budget plus a few
// kilobytes per open connection (unchargedBytes of its review, the
// server's buffers), whatever clients announce or send.
const DefaultMaxReviewBytesInFlight = 4 * DefaultMaxReviewBytes

// DefaultReviewReadTimeout bounds the time from a review's first byte to
// the end of its body (Server's; a handler mounted elsewhere counts
// from its headers). The apiserver gives up on a webhook call after the
// configuration's timeoutSeconds (10 s by default, 30 s at most), so a
// body still arriving after that is not worth waiting for.
const DefaultReviewReadTimeout = 10 * time.Second

// reviewLimits bound what one review may take from the process.
type reviewLimits struct {
	maxBytes    int64               // one review
	budget      *semaphore.Weighted // review buffer bytes of all requests together
	readTimeout time.Duration       // headers read to body read
	// serverDeadline: Server's ReadTimeout already bounds
	// the body's read, so the handler sets no read deadline of its own.
	serverDeadline bool
}

func newReviewLimits(maxBytes, inFlight int64, readTimeout time.Duration) (reviewLimits, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxReviewBytes
	}
	if inFlight <= 0 {
		inFlight = max(DefaultMaxReviewBytesInFlight, 2*maxBytes)
	}
	if readTimeout <= 0 {
		readTimeout = DefaultReviewReadTimeout
	}
	if err := CheckReviewLimits(maxBytes, inFlight); err != nil {
		return reviewLimits{}, err
	}
	return reviewLimits{maxBytes: maxBytes, budget: semaphore.NewWeighted(inFlight), readTimeout: readTimeout}, nil
}

// CheckReviewLimits refuses a budget of review bytes in flight below twice
// the largest review: room for a review at the limit while another holds
// as much.
func CheckReviewLimits(maxBytes, inFlight int64) error {
	if inFlight < 2*maxBytes {
		return fmt.Errorf("review bytes in flight (%d) must be at least twice the largest review (%d)", inFlight, maxBytes)
	}
	return nil
}

// errBudget marks a review that could not get buffer space before its read
// deadline: other reviews held the whole budget.
var errBudget = errors.New("the webhook's budget of review bytes in flight is spent (other reviews hold it)")

// unchargedBytes of each review buffer are not charged to the budget, so
// that every review's first bytes, which name it (request.uid), can be
// read and the review denied by name even while the budget is spent. It
// costs no more per connection than the server's own 4 KiB read buffer.
const unchargedBytes = 4 << 10

// charge is what a buffer of capacity bytes costs the budget.
func charge(capacity int64) int64 { return max(0, capacity-unchargedBytes) }

// chargedBuffer is a review buffer charged to the budget, so that the
// review buffers of all requests together never exceed the budget plus
// unchargedBytes per review, whatever clients announce or send.
//
// A review that declares its length (the apiserver always does) reserves
// it at once, waiting at most until ctx ends, once its body outgrows
// unchargedBytes: it waits holding no charge, so reviews waiting for each
// other cannot deadlock, and concurrent large reviews take turns. Its
// buffer still grows only as bytes arrive: a client that announces 8 MiB
// and stalls holds budget until its read deadline, never memory. A review
// without a declared length charges each growth as it comes and fails at
// once when the budget is spent, since it would wait holding a charge.
type chargedBuffer struct {
	buf     *bytes.Buffer
	budget  *semaphore.Weighted
	reserve int64 // declared length + 1 (room to read the EOF); 0: unknown
	charged int64
	started bool
	// deadline, when set, bounds the wait for budget (the read deadline);
	// the timer it takes is only made when the review must wait.
	deadline time.Time
}

// grow makes room for at least one more read, never past limit+1 bytes of
// capacity (nor past the declared length + 1): bytes.Buffer's own growth
// would double a refused body's memory at the last step.
func (c *chargedBuffer) grow(ctx context.Context, limit int64) error {
	if !c.started {
		c.started = true
		if need := charge(int64(c.buf.Cap())); need > 0 { // a pooled buffer
			if !c.budget.TryAcquire(need) {
				*c.buf = *bytes.NewBuffer(make([]byte, 0, unchargedBytes))
			} else {
				c.charged = need
			}
		}
	}
	if c.buf.Available() > 0 {
		return nil
	}
	next := min(max(2*int64(c.buf.Cap()), unchargedBytes), limit+1)
	if c.reserve > 0 {
		next = min(next, max(c.reserve, unchargedBytes))
	}
	if need := charge(next); need > c.charged {
		switch {
		case c.reserve > 0 && c.charged == 0:
			// Holding no charge, the review may wait for its whole
			// declared length.
			all := charge(min(c.reserve, limit+1))
			if err := c.acquire(ctx, all); err != nil {
				return errBudget
			}
			c.charged = all
		case c.reserve > 0:
			// Within its reservation (a pooled buffer's charge held
			// first): take the rest without waiting.
			if !c.budget.TryAcquire(need - c.charged) {
				return errBudget
			}
			c.charged = need
		default:
			if !c.budget.TryAcquire(need - c.charged) {
				return errBudget
			}
			c.charged = need
		}
	}
	grown := bytes.NewBuffer(make([]byte, 0, next))
	grown.Write(c.buf.Bytes())
	*c.buf = *grown
	return nil
}

// acquire takes n bytes of budget, waiting until ctx ends or the deadline
// passes. The semaphore serves waiters in order, so TryAcquire succeeds
// only when Acquire would not wait.
func (c *chargedBuffer) acquire(ctx context.Context, n int64) error {
	if c.budget.TryAcquire(n) {
		return nil
	}
	if !c.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, c.deadline)
		defer cancel()
	}
	return c.budget.Acquire(ctx, n)
}

// release returns the charge; the buffer must not grow afterwards.
func (c *chargedBuffer) release() {
	c.budget.Release(c.charged)
	c.charged = 0
}

// readReview reads body into c, at most limit+1 bytes, so that a larger
// body shows as n > limit. The buffer grows as bytes arrive (doubling from
// 4 KiB), never to the length a client declares before it sent it.
func readReview(ctx context.Context, c *chargedBuffer, body io.Reader, limit int64) (n int64, err error) {
	lr := io.LimitReader(body, limit+1)
	for {
		if int64(c.buf.Len()) > limit {
			return int64(c.buf.Len()), nil
		}
		if err := c.grow(ctx, limit); err != nil {
			return int64(c.buf.Len()), err
		}
		free := c.buf.AvailableBuffer()
		m, err := lr.Read(free[:cap(free)])
		c.buf.Write(free[:m]) // in place: free is buf's own spare capacity
		if err == io.EOF {
			return int64(c.buf.Len()), nil
		}
		if err != nil {
			return int64(c.buf.Len()), err
		}
	}
}

// uidPrefixBytes is how much of a review declared too large is read to
// find its uid: the apiserver writes request.uid before everything else of
// the request (the order of AdmissionRequest's fields).
const uidPrefixBytes = 4 << 10

// errStop ends a scan once the uid is found.
var errStop = errors.New("stop")

// reviewUID finds request.uid in a review that cannot be decoded whole (it
// is truncated, too large, too deep or malformed past the uid), so that
// the refusal can still be an answer the apiserver matches to its request.
// It returns "" when the bytes hold no readable uid before the damage.
func reviewUID(data []byte) string {
	var uid string
	_, _ = rawjson.ObjectScan(data, func(k, data []byte, start int) (int, error) {
		if !rawjson.KeyIs(k, "request") {
			return rawjson.Skip(data, start)
		}
		_, _ = rawjson.ObjectScan(data[start:], func(k, data []byte, start int) (int, error) {
			if !rawjson.KeyIs(k, "uid") {
				return rawjson.Skip(data, start)
			}
			end, err := rawjson.SkipString(data, start)
			if err == nil {
				uid, _ = rawjson.String(data[start:end])
			}
			return 0, errStop
		})
		return 0, errStop
	})
	return uid
}
