package audit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"
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

// ErrEventTooLarge marks an event above the configured size limit; the
// error that matches it names the event's size and the limit.
var ErrEventTooLarge = errors.New("event larger than the size limit")

type eventSizeError struct{ size, limit int }

func (e eventSizeError) Error() string {
	return fmt.Sprintf("event of %d bytes is larger than the limit of %d bytes", e.size, e.limit)
}

func (e eventSizeError) Is(target error) bool { return target == ErrEventTooLarge }

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

// Sample is what a dead letter keeps of an input: its first SampleBytes.
func Sample(b []byte) []byte {
	if len(b) > SampleBytes {
		return b[:SampleBytes]
	}
	return b
}

// EventListVersion is the only EventList apiVersion the sink reads. The
// apiserver of every supported Kubernetes release sends it
// (--audit-webhook-version accepts nothing else since v1beta1 was
// removed), so another version means a misconfigured or foreign client.
const EventListVersion = "audit.k8s.io/v1"

// EnvelopeError reports a body that is JSON but not an audit.k8s.io/v1
// EventList: a wrong or missing kind or apiVersion, items that are not an
// array, a single Event without the wrapper. ListReader returns it before
// handing out any item, so nothing of the body is stored; the sink answers
// 400 with it.
type EnvelopeError struct{ Reason string }

// Error implements error.
func (e *EnvelopeError) Error() string {
	return "not an " + EventListVersion + " EventList: " + e.Reason
}

// ListReader splits an audit.k8s.io/v1 EventList
// ({"kind":"EventList","apiVersion":"audit.k8s.io/v1",...,"items":[{...},{...}]})
// into its items as a stream: it holds one item at a time, never the whole
// body. kind and apiVersion must come before items (the apiserver writes
// them first), so that the envelope is checked before anything is stored.
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

	kind, version bool // seen, and valid
	items         bool // the items member was met
	eventKeys     bool // a key only an Event has (auditID, stage) was met
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
			return Sample(b), errors.New("unexpected end of input inside an event")
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
			head = Sample(l.buf[l.start:l.pos])
		}
		l.start = l.pos
		return head, eventSizeError{size, l.max}
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
	rest := Sample(bytes.TrimSpace(l.buf[l.start:]))
	return Item{Raw: rest, Err: fmt.Errorf("malformed EventList: %s", reason)}, nil
}

// envelope ends the stream with an *EnvelopeError.
func (l *ListReader) envelope(format string, args ...any) (Item, error) {
	l.done = true
	return Item{}, &EnvelopeError{Reason: fmt.Sprintf(format, args...)}
}

// jsonType names the JSON type of a value by its first byte.
func jsonType(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// member checks an envelope member whose value starts at pos: kind and
// apiVersion are checked, items opens the list. It reports whether the
// value was consumed (items, kind, apiVersion) and the envelope error, if
// any.
func (l *ListReader) member(key string, c byte) (bool, *EnvelopeError) {
	envErr := func(format string, args ...any) (bool, *EnvelopeError) {
		return true, &EnvelopeError{Reason: fmt.Sprintf(format, args...)}
	}
	switch key {
	case `"auditID"`, `"stage"`, `"stageTimestamp"`:
		l.eventKeys = true
	case `"kind"`, `"apiVersion"`:
		if l.items {
			return false, nil // a repeat after the items: ListReader ignores it
		}
		raw, err := l.value()
		if err != nil || l.rerr != nil {
			return true, nil //nolint:nilerr // value's error is met again by the caller's next read
		}
		v := string(raw)
		if key == `"kind"` {
			switch v {
			case `"EventList"`:
				l.kind = true
			case `"Event"`:
				return envErr(`kind "Event": a single audit Event, not an EventList; send {"kind":"EventList","apiVersion":%q,"items":[...]}`, EventListVersion)
			default:
				return envErr("kind %s, want \"EventList\"", v)
			}
			return true, nil
		}
		switch v {
		case `"` + EventListVersion + `"`:
			l.version = true
		case `"audit.k8s.io/v1beta1"`, `"audit.k8s.io/v1alpha1"`:
			return envErr("apiVersion %s is not read by this sink: send %s (kube-apiserver --audit-webhook-version=%s, the default)", v, EventListVersion, EventListVersion)
		default:
			return envErr("apiVersion %s, want %q", v, EventListVersion)
		}
		return true, nil
	case `"items"`:
		if l.items {
			return false, nil
		}
		l.items = true
		switch {
		case !l.kind && !l.version:
			return envErr("kind and apiVersion must come before items")
		case !l.kind:
			return envErr("no kind before items")
		case !l.version:
			return envErr("no apiVersion before items")
		case c == '[':
			l.pos++
			l.state = listItems
			return true, nil
		case c == 'n':
			return false, nil // null: no items
		default:
			return envErr("items is %s, not an array", jsonType(c))
		}
	}
	return false, nil
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
				switch c {
				case 0:
					l.done = true
					return Item{}, io.EOF
				case '[':
					return l.envelope("the body is a JSON array, not an EventList object")
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
				if !l.items {
					if l.eventKeys {
						return l.envelope("a single audit Event without the EventList wrapper")
					}
					return l.envelope("no items")
				}
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
			if used, envErr := l.member(key, c); envErr != nil {
				l.done = true
				return Item{}, envErr
			} else if used {
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

// RowReader is an ItemReader that also decodes: NextRow returns the next
// item and, when its Err is nil, its row in r.
type RowReader interface {
	ItemReader
	NextRow(d *Decoder, r *Row) (Item, error)
}

// NextRow returns the next item of items decoded by d into r: an item
// whose Err is nil holds a row in r (its strings, like Raw, valid until
// the next call), and one whose Err is set is a dead letter, which a
// decoding error makes of an item too. A RowReader decodes in its own
// way (ListReader in one pass); any other reader's items are decoded one
// by one.
func NextRow(items ItemReader, d *Decoder, r *Row) (Item, error) {
	if rr, ok := items.(RowReader); ok {
		return rr.NextRow(d, r)
	}
	it, err := items.Next()
	if err == nil && it.Err == nil {
		it.Err = d.Decode(unsafe.String(unsafe.SliceData(it.Raw), len(it.Raw)), r)
	}
	return it, err
}

// NextRow implements RowReader: an event that lies whole in the read
// buffer is decoded where it lies, in the one pass that also finds its
// end, instead of being split first and decoded after. Anything else
// (the first item, an event the buffer cuts, one that does not decode) is
// split by Next and decoded on its own, so that every item comes out
// exactly as Next and Decode make it.
func (l *ListReader) NextRow(d *Decoder, r *Row) (Item, error) {
	if !l.done && l.state == listItems {
		c := l.peek()
		if c == ',' {
			l.pos++
			c = l.peek()
		}
		if l.rerr != nil {
			return Item{}, l.rerr
		}
		if c == '{' {
			start := l.pos
			if n, err := d.decode(unsafe.String(&l.buf[start], len(l.buf)-start), r, true); err == nil {
				l.start, l.pos = start, start+n
				raw, tooLarge := l.finish(nil, 0) // a dead letter if over the limit
				return Item{Raw: raw, Err: tooLarge}, nil
			}
		}
	}
	it, err := l.Next()
	if err == nil && it.Err == nil {
		it.Err = d.Decode(unsafe.String(unsafe.SliceData(it.Raw), len(it.Raw)), r)
	}
	return it, err
}
