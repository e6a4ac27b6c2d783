package logfile

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
)

// DefaultMaxLineBytes is the default line limit: far above a
// RequestResponse event of a large object (etcd caps objects near 1.5 MiB,
// and an event may hold the request and the response, JSON-escaped).
const DefaultMaxLineBytes = 16 << 20

// ErrLineTooLong is wrapped by *LineTooLongError.
var ErrLineTooLong = errors.New("line too long")

// LineTooLongError reports a line that was skipped because it was longer
// than the limit.
type LineTooLongError struct {
	Offset int64 // offset of the line's first byte
	Length int64 // its length without the newline (so far, if unterminated)
	Max    int   // the limit
}

// Error implements error.
func (e *LineTooLongError) Error() string {
	return fmt.Sprintf("line at offset %d is %d bytes, longer than %d", e.Offset, e.Length, e.Max)
}

// Unwrap lets errors.Is match ErrLineTooLong.
func (e *LineTooLongError) Unwrap() error { return ErrLineTooLong }

// Line is one line of a log file.
type Line struct {
	// Data is the line without its newline. It belongs to the caller.
	Data []byte
	// Offset is the byte offset of the line's first byte.
	Offset int64
	// NoNewline is set on a last line that ended without a newline.
	NoNewline bool
	// Checkpoint is set by a Follower: the position just after this line,
	// for Follower.Confirm. Reader leaves it zero.
	Checkpoint Checkpoint
}

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// MaxLineBytes is the longest line yielded. Defaults to
	// DefaultMaxLineBytes (16 MiB) if zero.
	MaxLineBytes int
}

func (o *ReaderOptions) setDefaults() {
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
}

// Reader yields the lines of one file, plain or gzip. Not safe for
// concurrent use.
type Reader struct {
	sc      *scanner
	src     *countingReader
	closers []io.Closer
	done    bool
}

// countingReader counts the bytes read from the source, for progress.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Open opens the file at path for reading; gzip is detected by its magic
// bytes.
func Open(path string, opts ReaderOptions) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	r, err := NewReader(f, opts)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open audit log %s: %w", path, err)
	}
	r.closers = append(r.closers, f)
	return r, nil
}

// NewReader reads lines from src, which may be gzip-compressed (detected by
// its magic bytes). Close does not close src.
func NewReader(src io.Reader, opts ReaderOptions) (*Reader, error) {
	opts.setDefaults()
	cr := &countingReader{r: src}
	br := bufio.NewReaderSize(cr, 64<<10)
	magic, err := br.Peek(2)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read: %w", err)
	}
	r := &Reader{src: cr}
	var in io.Reader = br
	if bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		r.closers = append(r.closers, zr)
		in = zr
	}
	r.sc = newScanner(in, opts.MaxLineBytes)
	return r, nil
}

// Next returns the next line, io.EOF at the end, or a *LineTooLongError for
// a skipped line (call Next again to go on). Other errors (a damaged gzip
// stream, I/O) are final.
func (r *Reader) Next() (Line, error) {
	if r.done {
		return Line{}, io.EOF
	}
	l, err := r.sc.next()
	if !errors.Is(err, io.EOF) {
		return l, err
	}
	r.done = true
	if l, err, ok := r.sc.final(); ok {
		return l, err
	}
	return Line{}, io.EOF
}

// BytesRead is how many bytes have been read from the source so far
// (compressed bytes for gzip, read ahead of the lines returned): compare it
// with the file size for a progress bar.
func (r *Reader) BytesRead() int64 { return r.src.n }

// Close releases the file.
func (r *Reader) Close() error {
	var errs []error
	for _, c := range r.closers {
		errs = append(errs, c.Close())
	}
	r.closers = nil
	return errors.Join(errs...)
}

// scanner splits a stream into lines, tracking offsets. An io.EOF from
// next means "no complete line yet": for a live file, more may come.
type scanner struct {
	r    io.Reader
	max  int
	buf  []byte
	lo   int   // start of unread data in buf
	hi   int   // end of data in buf
	off  int64 // stream offset of buf[lo]
	err  error // read error held back until buffered lines are out
	slab []byte

	skipping bool // discarding an overlong line up to its newline
	skipOff  int64
	skipLen  int64
}

func newScanner(r io.Reader, max int) *scanner {
	return &scanner{r: r, max: max, buf: make([]byte, min(64<<10, max+1))}
}

// consumed is the stream offset up to which bytes have been read from r.
func (s *scanner) consumed() int64 { return s.off + int64(s.hi-s.lo) }

// next returns the next complete line. io.EOF means none is complete now.
func (s *scanner) next() (Line, error) {
	for {
		if i := bytes.IndexByte(s.buf[s.lo:s.hi], '\n'); i >= 0 {
			start := s.off
			s.lo += i + 1
			s.off += int64(i) + 1
			if s.skipping {
				s.skipping = false
				return Line{}, &LineTooLongError{Offset: s.skipOff, Length: s.skipLen + int64(i), Max: s.max}
			}
			if i > s.max {
				return Line{}, &LineTooLongError{Offset: start, Length: int64(i), Max: s.max}
			}
			return Line{Data: s.own(s.buf[s.lo-i-1 : s.lo-1]), Offset: start}, nil
		}
		n := s.hi - s.lo
		switch {
		case s.skipping:
			s.skipLen += int64(n)
			s.off += int64(n)
			s.lo, s.hi = 0, 0
		case n > s.max:
			s.skipping, s.skipOff, s.skipLen = true, s.off, int64(n)
			s.off += int64(n)
			s.lo, s.hi = 0, 0
		}
		if s.err != nil {
			err := s.err
			if errors.Is(err, io.EOF) {
				s.err = nil // a live file may grow
			}
			return Line{}, err
		}
		s.fill()
	}
}

// fill reads more into buf, compacting or growing it first.
func (s *scanner) fill() {
	if s.lo > 0 {
		copy(s.buf, s.buf[s.lo:s.hi])
		s.hi -= s.lo
		s.lo = 0
	}
	if s.hi == len(s.buf) {
		s.buf = append(s.buf, make([]byte, min(len(s.buf), s.max+1-len(s.buf)))...)
		s.buf = s.buf[:cap(s.buf)]
	}
	n, err := s.r.Read(s.buf[s.hi:])
	s.hi += n
	if err != nil {
		s.err = err
	} else if n == 0 {
		s.err = io.ErrNoProgress
	}
}

// final returns what is left after the stream ended for good: an
// unterminated last line, or the error for an unterminated overlong one.
func (s *scanner) final() (Line, error, bool) {
	n := s.hi - s.lo
	switch {
	case s.skipping:
		s.skipping = false
		l := s.skipLen + int64(n)
		s.off += int64(n)
		s.lo, s.hi = 0, 0
		return Line{}, &LineTooLongError{Offset: s.skipOff, Length: l, Max: s.max}, true
	case n == 0:
		return Line{}, nil, false
	case n > s.max:
		start := s.off
		s.off += int64(n)
		s.lo, s.hi = 0, 0
		return Line{}, &LineTooLongError{Offset: start, Length: int64(n), Max: s.max}, true
	}
	l := Line{Data: s.own(s.buf[s.lo:s.hi]), Offset: s.off, NoNewline: true}
	s.off += int64(n)
	s.lo, s.hi = 0, 0
	return l, nil, true
}

// reset discards everything buffered and restarts at stream offset off
// (after a seek of the underlying reader).
func (s *scanner) reset(off int64) {
	s.lo, s.hi, s.off, s.err = 0, 0, off, nil
	s.skipping = false
}

// own copies a line out of the read buffer. Lines are carved from shared
// slabs so that many small lines cost one allocation.
func (s *scanner) own(b []byte) []byte {
	const slabSize = 256 << 10
	if len(b) > slabSize/4 {
		return bytes.Clone(b)
	}
	if len(s.slab) < len(b) {
		s.slab = make([]byte, slabSize)
	}
	out := s.slab[:len(b):len(b)]
	copy(out, b)
	s.slab = s.slab[len(b):]
	return out
}
