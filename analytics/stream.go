package analytics

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Limits for one raw event.
const (
	// DefaultMaxEventBytes caps one event. Real events stay far below it;
	// a larger one is dead-lettered with its first SampleBytes.
	DefaultMaxEventBytes = 16 << 20
	// SampleBytes is how much of an oversized or malformed input a dead
	// letter keeps.
	SampleBytes = 64 << 10
)

// ErrEventTooLarge marks an event above the configured size limit.
var ErrEventTooLarge = errors.New("event larger than the size limit")

// Item is one raw event split from a stream. Raw is valid until the next
// call to Next. When Err is set the item is a dead letter: Raw holds (a
// sample of) the offending bytes and Err the reason.
type Item struct {
	Raw []byte
	Err error
}

// ItemReader splits a stream into raw events.
type ItemReader interface {
	// Next returns the next item, or io.EOF after the last. Any other error
	// is a read error of the underlying stream (not a malformed event).
	Next() (Item, error)
}

// MaybeGzip returns a reader that decompresses r when it starts with the
// gzip magic bytes, and r's bytes unchanged otherwise.
func MaybeGzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, err := br.Peek(2)
	if err != nil && err != io.EOF {
		return nil, err
	}
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		return gzip.NewReader(br)
	}
	return br, nil
}

func sample(b []byte) []byte {
	if len(b) > SampleBytes {
		return b[:SampleBytes]
	}
	return b
}

// ListReader splits an audit.k8s.io/v1 EventList
// ({"kind":"EventList",...,"items":[{...},{...}]}) into its items as a
// stream: it holds one item at a time, never the whole body.
type ListReader struct {
	r     io.Reader
	max   int
	buf   []byte
	start int // first byte not yet handed out
	pos   int // scan position
	eof   bool
	rerr  error
	state int
	done  bool
	moved int64 // bytes copied by compaction and growth (kept linear)
}

const (
	listBegin  = iota // before the opening brace
	listMember        // inside the envelope, before a key or '}'
	listItems         // inside "items": before an element or ']'
	listEnd           // after the envelope
)

// NewListReader reads an EventList from r; maxEvent <= 0 means
// DefaultMaxEventBytes.
func NewListReader(r io.Reader, maxEvent int) *ListReader {
	if maxEvent <= 0 {
		maxEvent = DefaultMaxEventBytes
	}
	return &ListReader{r: r, max: maxEvent, buf: (*bufPool.Get().(*[]byte))[:0]}
}

// bufPool recycles the 256 KiB read buffers of ListReaders (one per
// request); Release returns one.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}

// Release returns the reader's buffer for reuse; the reader and the items
// it returned must not be used afterwards.
func (l *ListReader) Release() {
	if cap(l.buf) == 256<<10 {
		b := l.buf[:0]
		bufPool.Put(&b)
	}
	l.buf = nil
}

// fill reads more input, keeping buf[start:]. It reports false at the end of
// input or on a read error (kept in rerr).
func (l *ListReader) fill() bool {
	if l.eof || l.rerr != nil {
		return false
	}
	// Move or grow only when the buffer is full, so that a client sending
	// a byte at a time costs O(n), not O(n²).
	if len(l.buf) == cap(l.buf) && l.start > 0 {
		n := copy(l.buf, l.buf[l.start:])
		l.moved += int64(n)
		l.pos -= l.start
		l.buf = l.buf[:n]
		l.start = 0
	}
	if len(l.buf) == cap(l.buf) {
		nb := make([]byte, len(l.buf), 2*cap(l.buf))
		l.moved += int64(copy(nb, l.buf))
		l.buf = nb
	}
	n, err := l.r.Read(l.buf[len(l.buf):cap(l.buf)])
	l.buf = l.buf[:len(l.buf)+n]
	if err == io.EOF {
		l.eof = true
	} else if err != nil {
		l.rerr = err
	}
	return n > 0 || (err == nil)
}

// peek skips whitespace and returns the next byte (0 at the end of input).
func (l *ListReader) peek() byte {
	for {
		for l.pos < len(l.buf) {
			switch c := l.buf[l.pos]; c {
			case ' ', '\n', '\t', '\r':
				l.pos++
			default:
				return c
			}
		}
		l.start = l.pos
		if !l.fill() {
			return 0
		}
	}
}

// value finds the end of the JSON value starting at pos. It returns the
// value's bytes, or a sample and an error when it is larger than the limit
// or unterminated.
func (l *ListReader) value() ([]byte, error) {
	l.start = l.pos
	if l.buf[l.pos] == '{' {
		if end, ok := objectEnd(l.buf, l.pos); ok {
			l.pos = end
			return l.finish(nil, 0)
		}
	}
	var (
		depth    int
		inString bool
		scalar   = l.buf[l.pos] != '{' && l.buf[l.pos] != '[' && l.buf[l.pos] != '"'
		first    = true
		skipped  int // bytes dropped from an oversized value
		head     []byte
	)
	for {
		for l.pos < len(l.buf) {
			c := l.buf[l.pos]
			switch {
			case first:
				first = false
				switch c {
				case '"':
					inString = true
				case '{', '[':
					depth = 1
				}
				l.pos++
				continue
			case scalar:
				switch c {
				case ',', ']', '}', ' ', '\n', '\t', '\r':
					return l.finish(head, skipped)
				}
				l.pos++
				continue
			case inString:
				// Strings are most of an event's bytes: find the closing
				// quote with IndexByte; a quote after an odd run of
				// backslashes is escaped.
				j := bytes.IndexByte(l.buf[l.pos:], '"')
				if j < 0 {
					l.pos = len(l.buf)
					continue
				}
				q := l.pos + j
				l.pos = q + 1
				bs := 0
				for k := q - 1; k >= l.start && l.buf[k] == '\\'; k-- {
					bs++
				}
				if bs%2 == 1 {
					continue
				}
				inString = false
				if depth == 0 {
					return l.finish(head, skipped)
				}
				continue
			}
			l.pos++
			switch c {
			case '"':
				inString = true
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return l.finish(head, skipped)
				}
			}
		}
		if size := l.pos - l.start + skipped; size > l.max {
			if head == nil {
				head = append([]byte(nil), l.buf[l.start:min(l.pos, l.start+SampleBytes)]...)
			}
			skipped += l.pos - l.start
			l.start = l.pos
		}
		if !l.fill() {
			if scalar && l.eof {
				return l.finish(head, skipped)
			}
			b := l.buf[l.start:l.pos]
			if head != nil {
				b = head
			}
			return sample(b), errors.New("unexpected end of input inside an event")
		}
	}
}

// objectEnd finds the end of the object at buf[start] when all of it is
// in buf, which is nearly always so for events in a 256 KiB buffer: one
// tight loop instead of value's resumable one. It reports false when buf
// ends first; value then scans again in its resumable way.
func objectEnd(buf []byte, start int) (int, bool) {
	depth := 0
	for i := start; i < len(buf); {
		c := buf[i]
		i++
		switch c {
		case '"':
			for {
				j := bytes.IndexByte(buf[i:], '"')
				if j < 0 {
					return 0, false
				}
				q := i + j
				i = q + 1
				bs := 0 // a quote after an odd run of backslashes is escaped
				for k := q - 1; k > start && buf[k] == '\\'; k-- {
					bs++
				}
				if bs%2 == 0 {
					break
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i, true
			}
		}
	}
	return 0, false
}

func (l *ListReader) finish(head []byte, skipped int) ([]byte, error) {
	if size := skipped + l.pos - l.start; head != nil || size > l.max {
		if head == nil {
			head = sample(l.buf[l.start:l.pos])
		}
		l.start = l.pos
		return head, fmt.Errorf("%w (%d bytes)", ErrEventTooLarge, size)
	}
	b := l.buf[l.start:l.pos]
	l.start = l.pos
	return b, nil
}

// malformed ends the stream with a dead letter of what is left.
func (l *ListReader) malformed(reason string) (Item, error) {
	l.done = true
	for len(l.buf)-l.start < SampleBytes && l.fill() {
	}
	if l.rerr != nil {
		return Item{}, l.rerr
	}
	rest := sample(bytes.TrimSpace(l.buf[l.start:]))
	return Item{Raw: rest, Err: fmt.Errorf("malformed EventList: %s", reason)}, nil
}

// Next implements ItemReader.
func (l *ListReader) Next() (Item, error) {
	for !l.done {
		c := l.peek()
		if l.rerr != nil {
			return Item{}, l.rerr
		}
		switch l.state {
		case listBegin:
			if c != '{' {
				if c == 0 {
					l.done = true
					return Item{}, io.EOF
				}
				return l.malformed("expected an object")
			}
			l.pos++
			l.state = listMember
		case listMember:
			switch c {
			case ',':
				l.pos++
				continue
			case '}':
				l.pos++
				l.state = listEnd
				continue
			case '"':
			default:
				return l.malformed("expected a key in the EventList")
			}
			rawKey, err := l.value()
			if l.rerr != nil {
				return Item{}, l.rerr
			}
			if err != nil {
				return l.malformed(err.Error())
			}
			key := string(rawKey) // peek may move the buffer

			if l.peek() != ':' {
				return l.malformed("expected ':'")
			}
			l.pos++
			c = l.peek()
			if c == 0 {
				return l.malformed("unexpected end of input")
			}
			if key == `"items"` && c == '[' {
				l.pos++
				l.state = listItems
				continue
			}
			if _, err := l.value(); l.rerr != nil {
				return Item{}, l.rerr
			} else if err != nil {
				return l.malformed(err.Error())
			}
		case listItems:
			switch c {
			case ',':
				l.pos++
				continue
			case ']':
				l.pos++
				l.state = listMember
				continue
			case 0:
				return l.malformed("unexpected end of input in items")
			}
			raw, err := l.value()
			if l.rerr != nil {
				return Item{}, l.rerr
			}
			if err != nil {
				if !errors.Is(err, ErrEventTooLarge) {
					l.done = true
				}
				return Item{Raw: raw, Err: err}, nil
			}
			if raw[0] != '{' {
				return Item{Raw: raw, Err: errors.New("EventList item is not an object")}, nil
			}
			return Item{Raw: raw}, nil
		case listEnd:
			if c != 0 {
				return l.malformed("data after the EventList")
			}
			l.done = true
		}
	}
	return Item{}, io.EOF
}
