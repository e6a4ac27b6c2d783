package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
)

// The read side: Next hands out whole batches, Confirm makes their
// delivery durable and deletes the segments fully confirmed.

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
