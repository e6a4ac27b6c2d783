package spool

import (
	"fmt"
	"os"
	"time"
)

// The write side: Append, and the group commit that shares one write and
// one fsync between concurrent appends.

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
