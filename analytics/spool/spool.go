package spool

import (
	"context"
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

// recover loads the checkpoint and checks every unconfirmed segment.
func (s *Spool) recover() error {
	st, err := readCheckpoint(s.dir)
	if err != nil {
		return err
	}
	cp := st.pos
	seqs, err := listSegments(s.dir)
	if err != nil {
		return err
	}
	maxSeq := cp.Segment
	for i, seq := range seqs {
		maxSeq = max(maxSeq, seq)
		if seq < cp.Segment {
			// Confirmed; a crash came between checkpoint and delete.
			if err := os.Remove(s.segPath(seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove confirmed segment: %w", err)
			}
			continue
		}
		seg, recs, err := s.recoverSegment(seq, cp, i == len(seqs)-1)
		if err != nil {
			return err
		}
		if seg == nil {
			continue
		}
		s.segs = append(s.segs, seg)
		s.diskBytes += seg.size
		s.pending += recs
	}
	s.nextSeq = maxSeq + 1
	s.read, s.confirmed = cp, cp
	if s.pending > 0 && len(s.segs) > 0 {
		first, lastSeg := s.segs[0], s.segs[len(s.segs)-1]
		at := time.Now()
		if fi, err := os.Stat(s.segPath(first.seq)); err == nil {
			at = fi.ModTime()
		}
		s.ages = []appendAge{{end: Position{Segment: lastSeg.seq, Offset: lastSeg.size}, at: at}}
	}
	s.checkpoint, err = openCheckpoint(s.dir, st, s.opts.NoSync)
	return err
}

// recoverSegment checks one segment from its start (or the checkpoint) to
// its end. It returns nil for a last segment whose creation was torn.
func (s *Spool) recoverSegment(seq uint64, cp Position, last bool) (*segment, int64, error) {
	path := s.segPath(seq)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open segment %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("stat segment %s: %w", path, err)
	}
	size := st.Size()
	hdr := make([]byte, segmentHeaderSize)
	_, herr := f.ReadAt(hdr, 0)
	if herr != nil || !checkSegmentHeader(hdr, seq) {
		if last && size <= segmentHeaderSize {
			// Created but never used: no batch can have been acknowledged.
			s.log.Warn("removing segment with a torn header", "file", path, "size", size)
			if err := os.Remove(path); err != nil {
				return nil, 0, fmt.Errorf("remove torn segment %s: %w", path, err)
			}
			return nil, 0, nil
		}
		cerr := &CorruptError{Path: path, Offset: 0, Err: errors.New("bad segment header")}
		if !s.opts.SkipCorrupt {
			return nil, 0, cerr
		}
		s.log.Error("segment header damaged, reading its batches anyway", "err", cerr)
	}
	off := int64(segmentHeaderSize)
	if seq == cp.Segment && cp.Offset > off {
		off = cp.Offset
	}
	if off > size {
		cerr := &CorruptError{Path: filepath.Join(s.dir, checkpointName), Offset: cp.Offset,
			Err: fmt.Errorf("checkpoint past the end of %s (%d bytes)", path, size)}
		if !s.opts.SkipCorrupt {
			return nil, 0, cerr
		}
		s.log.Error("checkpoint past the segment end, treating the segment as confirmed", "err", cerr)
		off = size
	}

	var recs int64
	for off < size {
		n, r, err := readBatchAt(f, off, size)
		if err == nil {
			recs += int64(r)
			off += n
			continue
		}
		if !errors.Is(err, errBadBatch) {
			return nil, 0, fmt.Errorf("read segment %s at %d: %w", path, off, err)
		}
		rest := make([]byte, size-off)
		if _, err := f.ReadAt(rest, off); err != nil {
			return nil, 0, fmt.Errorf("read segment %s at %d: %w", path, off, err)
		}
		if last && tornTail(rest, off) {
			s.log.Warn("truncating torn tail of the last segment (an unacknowledged commit)",
				"file", path, "offset", off, "bytes", size-off, "err", err)
			if err := f.Truncate(off); err != nil {
				return nil, 0, fmt.Errorf("truncate torn tail of %s: %w", path, err)
			}
			if err := s.sync(f); err != nil {
				return nil, 0, fmt.Errorf("fsync %s: %w", path, err)
			}
			size = off
			break
		}
		cerr := &CorruptError{Path: path, Offset: off, Err: err}
		if !s.opts.SkipCorrupt {
			return nil, 0, cerr
		}
		skip := int64(len(rest))
		if at, _ := nextIntact(rest, 0); at >= 0 {
			skip = int64(at)
		}
		s.log.Error("skipping damaged spool data", "err", cerr, "skippedBytes", skip)
		off += skip
	}
	return &segment{seq: seq, size: size, sealed: true}, recs, nil
}

// tornTail reports whether damage at the start of rest (which begins at
// segment offset off) is a torn write: no intact batch after it belongs to
// a later commit group.
func tornTail(rest []byte, off int64) bool {
	for at := 0; ; {
		next, bh := nextIntact(rest, at)
		if next < 0 {
			return true
		}
		if bh.groupStart > off {
			return false
		}
		at = next
	}
}

// readBatchAt checks the batch at off (with the segment's valid end at
// size) and returns its length and record count without keeping it.
func readBatchAt(f *os.File, off, size int64) (int64, int, error) {
	bh, body, err := readBatch(f, off, size)
	if err != nil {
		return 0, 0, err
	}
	if _, err := decodeBatchBody(make([][]byte, 0, bh.count), body, bh.count); err != nil {
		return 0, 0, err
	}
	return batchHeaderSize + bh.bodyLen, bh.count, nil
}

// readBatch reads the header and raw body of the batch at off. Checks that
// fail are errBadBatch; I/O errors are returned as they are.
func readBatch(f *os.File, off, size int64) (batchHeader, []byte, error) {
	if size-off < batchHeaderSize {
		return batchHeader{}, nil, fmt.Errorf("%w: %d bytes left, less than a header", errBadBatch, size-off)
	}
	var hdr [batchHeaderSize]byte
	if _, err := f.ReadAt(hdr[:], off); err != nil {
		return batchHeader{}, nil, err
	}
	bh, err := decodeBatchHeader(hdr[:])
	if err != nil {
		return bh, nil, err
	}
	if bh.bodyLen > size-off-batchHeaderSize {
		return bh, nil, fmt.Errorf("%w: body of %d bytes runs past the end", errBadBatch, bh.bodyLen)
	}
	body := make([]byte, bh.bodyLen)
	if _, err := f.ReadAt(body, off+batchHeaderSize); err != nil {
		return bh, nil, err
	}
	return bh, body, nil
}

// sync makes f's data durable unless fsync is off. fdatasync is enough:
// it also flushes the size and block metadata that reading the data back
// needs, and skips only timestamps.
func (s *Spool) sync(f *os.File) error {
	if s.opts.NoSync {
		return nil
	}
	return fsyncFile(f)
}

// fsyncFile and fsyncDir are the system calls behind every durability
// point of the spool (segments, their directory entries, the
// checkpoint). They are variables only so that a test can record what
// each call made durable and check it against what Append and Confirm
// promise when they return.
var (
	fsyncFile = fdatasync
	fsyncDir  = (*os.File).Sync
)

// syncDir fsyncs the spool directory so a created, renamed or removed
// entry survives a crash.
func (s *Spool) syncDir() error {
	if s.opts.NoSync {
		return nil
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return fsyncDir(d)
}

// Append durably adds one batch of records and returns the position after
// it. It returns once the batch is written and fsynced; concurrent calls
// share a write and an fsync. An empty batch writes nothing.
//
// Errors: ErrFull (retry later), ErrTooLarge, ErrClosed, or an I/O error.
// After an I/O error while writing, the state of the file is unknown, so the
// spool fails closed: every later Append returns that error, and reopening
// the spool recovers from what is on disk. Batches already acknowledged
// stay readable.
func (s *Spool) Append(records [][]byte) (Position, error) {
	size := encodedSize(records)
	if len(records) == 0 {
		return Position{}, nil
	}
	if size > s.opts.MaxBytes || size-batchHeaderSize > maxBatchBody {
		return Position{}, fmt.Errorf("%w: %d bytes, max %d", ErrTooLarge, size, s.opts.MaxBytes)
	}
	buf := s.getBuf(int(size))
	encodeBatch(buf, records)
	req := &appendReq{buf: buf, recs: len(records), done: make(chan struct{})}

	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		s.putBuf(buf)
		return Position{}, ErrClosed
	case s.failed != nil:
		err := s.failed
		s.mu.Unlock()
		s.putBuf(buf)
		return Position{}, fmt.Errorf("spool failed earlier, reopen to recover: %w", err)
	case s.diskBytes+s.queuedBytes+size+segmentHeaderSize > s.opts.MaxBytes:
		used := s.diskBytes + s.queuedBytes
		s.mu.Unlock()
		s.putBuf(buf)
		return Position{}, fmt.Errorf("%w: %d of %d bytes used, batch needs %d", ErrFull, used, s.opts.MaxBytes, size)
	}
	s.queuedBytes += size
	s.queue = append(s.queue, req)
	// After a lull (no commit for longer than the last one took) the
	// batch is probably alone: write it on the caller's goroutine rather
	// than hand it to a committer and wait to be woken, two scheduling
	// delays that a busy machine makes long. In a steady stream, hand it
	// over, so that the batches arriving meanwhile share its fsync.
	lead := false
	if !s.committing {
		s.committing = true
		if time.Since(s.lastCommit) > s.lastCommitTook {
			lead = true
		} else {
			go s.commitLoop()
		}
	}
	s.mu.Unlock()

	if lead {
		s.commitGroup()
		s.mu.Lock()
		if len(s.queue) > 0 {
			go s.commitLoop() // batches that queued behind this group
		} else {
			s.committing = false
			s.idle.Broadcast()
		}
		s.mu.Unlock()
	}
	<-req.done
	s.putBuf(buf)
	return req.pos, req.err
}

// getBuf returns an encode buffer of n bytes; buffers are reused because a
// typical batch is hundreds of kilobytes.
func (s *Spool) getBuf(n int) []byte {
	if p, ok := s.bufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func (s *Spool) putBuf(b []byte) {
	if cap(b) > 16<<20 {
		return // don't pin rare huge batches
	}
	s.bufs.Put(&b)
}

// segUpdate is what a commit group did to one segment, published under mu.
type segUpdate struct {
	seg  *segment
	size int64
	seal bool
	add  bool
}

// commitLoop writes queued batches in groups until the queue is empty.
// Only one committer runs at a time (s.committing: this loop, or an
// Append writing its own group), and it owns the write side.
func (s *Spool) commitLoop() {
	for s.commitGroup() {
	}
}

// commitGroup writes, fsyncs and publishes the queued batches as one
// group, and reports whether there was any. With none, it ends the
// committer's turn (under the same lock that Append checks it with). Only
// the committer calls it.
func (s *Spool) commitGroup() bool {
	s.mu.Lock()
	group := s.queue
	s.queue = nil
	if len(group) == 0 {
		s.committing = false
		s.idle.Broadcast()
		s.mu.Unlock()
		return false
	}
	failed := s.failed
	s.mu.Unlock()

	var groupBytes int64
	var recs int64
	for _, r := range group {
		groupBytes += int64(len(r.buf))
		recs += int64(r.recs)
	}
	var updates []segUpdate
	err := failed
	start := time.Now()
	if err == nil {
		updates, err = s.writeGroup(group)
	} else {
		err = fmt.Errorf("spool failed earlier, reopen to recover: %w", err)
	}

	s.mu.Lock()
	s.lastCommit = time.Now()
	s.lastCommitTook = s.lastCommit.Sub(start)
	s.queuedBytes -= groupBytes
	if err != nil && failed == nil {
		s.failed = err
	}
	if err == nil {
		for _, u := range updates {
			if u.add {
				s.segs = append(s.segs, u.seg)
				s.diskBytes += u.size
			} else {
				s.diskBytes += u.size - u.seg.size
			}
			u.seg.size = u.size
			u.seg.sealed = u.seal
		}
		s.pending += recs
		end := group[len(group)-1].pos
		if n := len(s.ages); n > 0 && start.Sub(s.ages[n-1].at) < time.Second {
			s.ages[n-1].end = end
		} else {
			s.ages = append(s.ages, appendAge{end: end, at: start})
		}
		close(s.notify)
		s.notify = make(chan struct{})
	}
	s.mu.Unlock()
	if err == nil {
		s.observe()
	}
	for _, r := range group {
		r.err = err
		close(r.done)
	}
	return true
}

// writeGroup writes and fsyncs one commit group, rolling segments as
// needed, and sets each request's position.
func (s *Spool) writeGroup(group []*appendReq) ([]segUpdate, error) {
	var updates []segUpdate
	dirty := false
	groupStart := s.wsize
	for _, r := range group {
		n := int64(len(r.buf))
		if s.wf == nil || (s.wsize > segmentHeaderSize && s.wsize+n > s.opts.SegmentBytes) {
			if s.wf != nil {
				// Seal: the old segment must be durable before a later
				// segment exists, which is what recovery relies on.
				if dirty {
					if err := s.sync(s.wf); err != nil {
						return nil, fmt.Errorf("fsync segment %s: %w", s.wf.Name(), err)
					}
				}
				if err := s.wf.Close(); err != nil {
					return nil, fmt.Errorf("close segment %s: %w", s.wf.Name(), err)
				}
				updates = append(updates, segUpdate{seg: s.wseg, size: s.wsize, seal: true})
				s.wf = nil
			}
			if err := s.createSegment(); err != nil {
				return nil, err
			}
			updates = append(updates, segUpdate{seg: s.wseg, size: s.wsize, add: true})
			groupStart = s.wsize
		}
		setGroupStart(r.buf, groupStart)
		if _, err := s.wf.WriteAt(r.buf, s.wsize); err != nil {
			return nil, fmt.Errorf("write segment %s at %d: %w", s.wf.Name(), s.wsize, err)
		}
		s.wsize += n
		dirty = true
		r.pos = Position{Segment: s.wseg.seq, Offset: s.wsize}
	}
	if dirty {
		if err := s.sync(s.wf); err != nil {
			return nil, fmt.Errorf("fsync segment %s: %w", s.wf.Name(), err)
		}
	}
	// The last update for the active segment carries its final size.
	if len(updates) > 0 && updates[len(updates)-1].seg == s.wseg {
		updates[len(updates)-1].size = s.wsize
	} else {
		updates = append(updates, segUpdate{seg: s.wseg, size: s.wsize})
	}
	return updates, nil
}

// createSegment starts a new segment file with its header, durably.
func (s *Spool) createSegment() error {
	seq := s.nextSeq
	path := s.segPath(seq)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return fmt.Errorf("create segment %s: %w", path, err)
	}
	if _, err := f.WriteAt(encodeSegmentHeader(seq), 0); err != nil {
		f.Close()
		return fmt.Errorf("write segment header %s: %w", path, err)
	}
	if err := s.sync(f); err != nil {
		f.Close()
		return fmt.Errorf("fsync segment %s: %w", path, err)
	}
	if err := s.syncDir(); err != nil {
		f.Close()
		return fmt.Errorf("fsync spool dir after creating %s: %w", path, err)
	}
	s.nextSeq++
	s.wf = f
	s.wseg = &segment{seq: seq}
	s.wsize = segmentHeaderSize
	return nil
}

// Next returns the next unread batches: at least one whole batch, and more
// while they are already on disk and the total stays within maxRecords
// (maxRecords <= 0 means one batch). It blocks until a batch is available,
// ctx is done, or the spool is closed (ErrClosed).
//
// Damaged data met here is handled as in Open: a *CorruptError, or with
// Options.SkipCorrupt a logged skip.
func (s *Spool) Next(ctx context.Context, maxRecords int) (Batch, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	var out Batch
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return Batch{}, ErrClosed
		}
		var seg *segment
		var size int64
		var sealed bool
		for _, sg := range s.segs {
			if sg.seq >= s.read.Segment {
				seg, size, sealed = sg, sg.size, sg.sealed
				break
			}
		}
		notify := s.notify
		s.mu.Unlock()

		if seg != nil && seg.seq > s.read.Segment {
			s.read = Position{Segment: seg.seq, Offset: segmentHeaderSize}
		}
		if seg != nil && s.read.Offset < segmentHeaderSize {
			s.read.Offset = segmentHeaderSize
		}
		switch {
		case seg != nil && s.read.Offset < size:
			recs, end, err := s.readNext(seg.seq, s.read.Offset, size)
			if err != nil {
				return Batch{}, err
			}
			if recs != nil {
				out.Records = append(out.Records, recs...)
			}
			s.read.Offset = end
			out.End = s.read
			if len(out.Records) > 0 && (maxRecords <= 0 || len(out.Records) >= maxRecords) {
				return s.hand(out), nil
			}
		case seg != nil && sealed:
			s.read = Position{Segment: seg.seq + 1}
		case len(out.Records) > 0:
			return s.hand(out), nil
		default:
			select {
			case <-ctx.Done():
				return Batch{}, context.Cause(ctx)
			case <-s.closedCh:
				return Batch{}, ErrClosed
			case <-notify:
			}
		}
	}
}

// hand records a delivery for Confirm's bookkeeping.
func (s *Spool) hand(b Batch) Batch {
	s.handed = append(s.handed, delivered{end: b.End, recs: int64(len(b.Records))})
	return b
}

// readNext reads the batch at off in segment seq (valid up to size). It
// returns the records and the offset after them; with SkipCorrupt, damage
// yields no records and the offset of the next intact batch.
func (s *Spool) readNext(seq uint64, off, size int64) ([][]byte, int64, error) {
	if s.rfile == nil || s.rseq != seq {
		s.closeReader()
		f, err := os.Open(s.segPath(seq))
		if err != nil {
			return nil, 0, fmt.Errorf("open segment for reading: %w", err)
		}
		s.rfile, s.rseq = f, seq
	}
	bh, body, err := readBatch(s.rfile, off, size)
	var recs [][]byte
	if err == nil {
		recs, err = decodeBatchBody(make([][]byte, 0, bh.count), body, bh.count)
		if err == nil {
			return recs, off + batchHeaderSize + bh.bodyLen, nil
		}
	}
	path := s.rfile.Name()
	if !errors.Is(err, errBadBatch) {
		return nil, 0, fmt.Errorf("read segment %s at %d: %w", path, off, err)
	}
	cerr := &CorruptError{Path: path, Offset: off, Err: err}
	if !s.opts.SkipCorrupt {
		return nil, 0, cerr
	}
	rest := make([]byte, size-off)
	if _, err := s.rfile.ReadAt(rest, off); err != nil {
		return nil, 0, fmt.Errorf("read segment %s at %d: %w", path, off, err)
	}
	skip := int64(len(rest))
	if at, _ := nextIntact(rest, 0); at >= 0 {
		skip = int64(at)
	}
	s.log.Error("skipping damaged spool data", "err", cerr, "skippedBytes", skip)
	return nil, off + skip, nil
}

func (s *Spool) closeReader() {
	if s.rfile != nil {
		s.rfile.Close()
		s.rfile = nil
	}
}

// Confirm records durably that everything up to pos (a Batch.End returned
// by Next) is stored downstream, and deletes segments that are wholly
// confirmed: sealed ones, and the one being written when all of it is
// confirmed and no commit is under way (the next Append starts a new
// one). After a restart, Next resumes after pos.
func (s *Spool) Confirm(pos Position) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if pos == s.confirmed {
		return nil
	}
	if pos.Less(s.confirmed) || s.read.Less(pos) {
		return fmt.Errorf("confirm %s: outside the unconfirmed range %s..%s", pos, s.confirmed, s.read)
	}
	i := slices.IndexFunc(s.handed, func(d delivered) bool { return d.end == pos })
	if i < 0 {
		return fmt.Errorf("confirm %s: not a batch end returned by Next", pos)
	}
	if err := s.checkpoint.write(pos); err != nil {
		return err
	}
	var recs int64
	for _, d := range s.handed[:i+1] {
		recs += d.recs
	}
	s.handed = slices.Delete(s.handed, 0, i+1)
	s.confirmed = pos

	s.mu.Lock()
	s.pending -= recs
	i = 0
	for i < len(s.ages) && !pos.Less(s.ages[i].end) {
		i++
	}
	s.ages = slices.Delete(s.ages, 0, i)
	// The segment being written, once wholly confirmed, goes too while no
	// commit is under way (the committer owns it; holding mu with
	// committing false, so do we): its space must not keep a drained
	// spool full. The next Append starts a new segment.
	var closeErr error
	if !s.committing {
		if w := s.wseg; w != nil && s.wf != nil && w.seq == pos.Segment && w.size == pos.Offset && s.wsize == w.size {
			closeErr = s.wf.Close()
			s.wf, s.wseg, s.wsize = nil, nil, 0
			w.sealed = true
		}
	}
	var drop []uint64
	s.segs = slices.DeleteFunc(s.segs, func(sg *segment) bool {
		done := sg.seq < pos.Segment || (sg.seq == pos.Segment && sg.sealed && sg.size <= pos.Offset)
		if done {
			drop = append(drop, sg.seq)
			s.diskBytes -= sg.size
		}
		return done
	})
	s.mu.Unlock()
	defer s.observe()
	var errs []error
	if closeErr != nil {
		errs = append(errs, fmt.Errorf("close confirmed segment: %w", closeErr))
	}
	for _, seq := range drop {
		if s.rfile != nil && s.rseq == seq {
			s.closeReader()
		}
		// The checkpoint is durable, so a segment that survives a crash
		// here is removed by the next Open.
		if err := os.Remove(s.segPath(seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove confirmed segment: %w", err))
		}
	}
	return errors.Join(errs...)
}

// rewind makes Next start again at the last confirmed position, for a
// drainer that dropped what it had read without storing it.
func (s *Spool) rewind() {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.read = s.confirmed
	s.handed = nil
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
