package spool

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults applied by Open to zero Options fields.
const (
	DefaultSegmentBytes = 64 << 20
	DefaultMaxBytes     = 1 << 30
)

// Options configure a Spool. The zero value is usable.
type Options struct {
	// SegmentBytes is the size at which a segment is closed and a new one
	// started. Defaults to DefaultSegmentBytes (64 MiB) if zero, and is
	// capped at MaxBytes/4: the segment being written is deleted only once
	// all of it is confirmed while no append is being committed, so under
	// steady appends its confirmed part (at most one segment) still counts
	// against MaxBytes and must leave room.
	SegmentBytes int64
	// MaxBytes caps the bytes on disk, confirmed-but-not-yet-deleted data
	// included; an Append that would pass it fails with ErrFull. Defaults to
	// DefaultMaxBytes (1 GiB) if zero.
	MaxBytes int64
	// NoSync turns fsync off. Fsync is on by default; without it a crash
	// can lose acknowledged batches. For tests and benchmarks only.
	NoSync bool
	// SkipCorrupt makes Open and Next skip damaged batches in the middle of
	// the spool, resynchronising on the next intact batch, instead of
	// failing with a *CorruptError. Off by default so that an operator
	// decides.
	SkipCorrupt bool
	// Logger receives warnings about torn tails and corruption. Defaults to
	// a logger that discards.
	Logger *slog.Logger
	// Observe, if set, is called with the spool's Stats after Open, after
	// every commit of appended batches and after every Confirm; calls are
	// serialised, each with the figures as they stand then. For metrics.
	Observe func(Stats)
}

func (o *Options) setDefaults() {
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	o.SegmentBytes = min(o.SegmentBytes, o.MaxBytes/4)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

var (
	// ErrFull means the batch would take the spool past Options.MaxBytes.
	// It is temporary: retry once the drainer has confirmed more.
	ErrFull = errors.New("spool full")
	// ErrTooLarge means the batch can never fit (larger than MaxBytes, or
	// its body larger than 4 GiB).
	ErrTooLarge = errors.New("batch larger than the spool can hold")
	// ErrClosed is returned by calls on a closed Spool.
	ErrClosed = errors.New("spool closed")
	// ErrCorrupt is wrapped by *CorruptError.
	ErrCorrupt = errors.New("spool corrupt")
	// ErrInUse means another Spool (in this or another process) has the
	// directory open.
	ErrInUse = errors.New("spool directory in use")
)

// CorruptError reports damaged data that is not a torn tail.
type CorruptError struct {
	Path   string // file holding the damage
	Offset int64  // byte offset of the first damaged batch (or checkpoint field)
	Err    error  // what check failed
}

// Error implements error.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("spool corrupt: %s at offset %d: %v", e.Path, e.Offset, e.Err)
}

// Unwrap lets errors.Is match ErrCorrupt and the cause.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// Position is a place in the spool: a segment number and a byte offset in
// it. Positions handed out by the spool are batch ends; they increase in
// append order.
type Position struct {
	Segment uint64
	Offset  int64
}

// Less reports whether p comes before q.
func (p Position) Less(q Position) bool {
	return p.Segment < q.Segment || (p.Segment == q.Segment && p.Offset < q.Offset)
}

// String formats p as segment:offset.
func (p Position) String() string { return fmt.Sprintf("%d:%d", p.Segment, p.Offset) }

// Batch is what Next returns: the records of one or more whole appended
// batches, in append order.
type Batch struct {
	// Records belong to the caller.
	Records [][]byte
	// End is the position after the last batch; Confirm it once the
	// records are stored downstream.
	End Position
}

// Stats are point-in-time figures for metrics.
type Stats struct {
	BytesOnDisk    int64 // segment bytes on disk, confirmed but undeleted data included
	Segments       int   // segment files
	RecordsPending int64 // records appended and not yet confirmed
	// OldestUnconfirmed is when the oldest record not yet confirmed was
	// appended, to about a second (zero when everything is confirmed).
	// For records recovered by Open it is the last write of the oldest
	// unconfirmed segment file: a lower bound of their age.
	OldestUnconfirmed time.Time
}

// appendAge dates the batches up to end: the first of them was committed
// at. Consecutive commits within a second share one, so the list stays
// short however many small batches are appended.
type appendAge struct {
	end Position
	at  time.Time
}

// segment is the shared view of one segment file; fields are guarded by
// Spool.mu.
type segment struct {
	seq    uint64
	size   int64 // committed (fsynced, or written with NoSync) bytes
	sealed bool  // no more appends; a later segment exists or will
}

// appendReq is one Append waiting for its commit group.
type appendReq struct {
	buf  []byte
	recs int
	done chan struct{}
	pos  Position
	err  error
}

// delivered remembers how many records a Next handed out up to end, so
// Confirm can keep RecordsPending right.
type delivered struct {
	end  Position
	recs int64
}

// Spool is a durable queue of record batches in a directory. It is safe
// for concurrent Append calls and one reader; see the package doc.
type Spool struct {
	dir  string
	opts Options
	log  *slog.Logger
	bufs sync.Pool // *[]byte encode buffers
	lock *os.File  // held flock on dir/lock; nil where unsupported

	mu          sync.Mutex
	idle        *sync.Cond // signalled when the committer stops
	segs        []*segment // ascending by seq
	queue       []*appendReq
	queuedBytes int64
	diskBytes   int64
	pending     int64
	committing  bool
	notify      chan struct{} // closed and replaced on every commit
	closed      bool
	closedCh    chan struct{}
	failed      error // sticky I/O failure; see Append
	// When the last commit group ended and how long it took.
	lastCommit     time.Time
	lastCommitTook time.Duration
	ages           []appendAge // of the unconfirmed batches, in order
	omu            sync.Mutex  // serialises Observe calls

	// Owned by the committer goroutine (at most one runs, see committing).
	wf      *os.File
	wseg    *segment
	wsize   int64
	nextSeq uint64

	// Reader state, guarded by rmu.
	rmu        sync.Mutex
	read       Position
	rfile      *os.File
	rseq       uint64
	confirmed  Position
	handed     []delivered
	checkpoint *checkpointFile
}

// Open opens or creates the spool in dir and recovers it: see the package
// doc for what happens to torn and corrupt data.
func Open(dir string, opts Options) (*Spool, error) {
	opts.setDefaults()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create spool dir: %w", err)
	}
	s := &Spool{
		dir:      dir,
		opts:     opts,
		log:      opts.Logger.With("spool", dir),
		notify:   make(chan struct{}),
		closedCh: make(chan struct{}),
	}
	s.idle = sync.NewCond(&s.mu)
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	if err := s.recover(); err != nil {
		s.releaseLock()
		return nil, err
	}
	s.observe()
	return s, nil
}

// observe hands the current Stats to Options.Observe.
func (s *Spool) observe() {
	if s.opts.Observe == nil {
		return
	}
	s.omu.Lock()
	defer s.omu.Unlock()
	s.opts.Observe(s.Stats())
}

// segPath is the file name of segment seq.
func (s *Spool) segPath(seq uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%020d.seg", seq))
}

// listSegments returns the segment numbers in dir, ascending.
func listSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list spool dir: %w", err)
	}
	var seqs []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		seq, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue // not ours
		}
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	return seqs, nil
}

// Stats returns figures for metrics.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{BytesOnDisk: s.diskBytes, Segments: len(s.segs), RecordsPending: s.pending}
	if len(s.ages) > 0 && s.pending > 0 {
		st.OldestUnconfirmed = s.ages[0].at
	}
	return st
}

// Close waits for appends already queued to be written, then releases the
// files. Blocked Next calls return ErrClosed; later calls fail with it.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closedCh)
	for s.committing {
		s.idle.Wait()
	}
	var err error
	if s.wf != nil {
		err = s.wf.Close()
		s.wf = nil
	}
	s.mu.Unlock()

	s.rmu.Lock()
	s.closeReader()
	if s.checkpoint != nil {
		if cerr := s.checkpoint.close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	s.rmu.Unlock()
	s.releaseLock()
	if err != nil {
		return fmt.Errorf("close spool: %w", err)
	}
	return nil
}

func (s *Spool) releaseLock() {
	if s.lock != nil {
		s.lock.Close() // closing the descriptor drops the flock
		s.lock = nil
	}
}
