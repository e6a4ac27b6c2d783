package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Recovery: what Open does with what an earlier process left in the
// directory (torn tails, damaged batches, the checkpoint), and the fsyncs
// every writer of the directory uses.

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
