package rawjson

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// Scanner is a validating JSON scanner over a string, read from the
// front: the audit decoder reads an event member by member with it, and
// passes over what it does not keep (requestObject, responseObject,
// user.extra, ...) validated but not materialised. Strings without escapes
// are returned as substrings of the input, so what is decoded mostly
// points into the input. The value-slice functions of this package (Skip,
// ObjectEach, Unquote, ...) share its skipping and unescaping.
type Scanner struct {
	s     string
	i     int
	depth int
}

// NewScanner returns a Scanner at the start of s.
func NewScanner(s string) Scanner { return Scanner{s: s} }

// Pos is the cursor's offset in the input.
func (p *Scanner) Pos() int { return p.i }

// ErrEnd is the Scanner's error for input that ends inside a value.
var ErrEnd = errors.New("unexpected end of JSON input")

// Errorf is an error at the cursor.
func (p *Scanner) Errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *Scanner) ws() {
	// Most values follow their ':' or ',' directly.
	if p.i < len(p.s) && p.s[p.i] > ' ' {
		return
	}
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\n', '\t', '\r':
			p.i++
		default:
			return
		}
	}
}

// Peek skips whitespace and returns the next byte, or 0 at the end.
func (p *Scanner) Peek() byte {
	p.ws()
	if p.i >= len(p.s) {
		return 0
	}
	return p.s[p.i]
}

func (p *Scanner) expect(c byte) error {
	if p.Peek() != c {
		if p.i >= len(p.s) {
			return ErrEnd
		}
		return p.Errorf("expected %q, found %q", c, p.s[p.i])
	}
	p.i++
	return nil
}

// open consumes the start byte of an object or array at the cursor, one
// level deeper, and reports whether the container is empty (then its end
// byte is consumed too and the level closed).
func (p *Scanner) open(start, end byte) (empty bool, err error) {
	if err := p.expect(start); err != nil {
		return false, err
	}
	if p.depth++; p.depth > maxDepth {
		return false, p.Errorf("nesting too deep: more than %d levels", maxDepth)
	}
	if p.Peek() == end {
		p.i++
		p.depth--
		return true, nil
	}
	return false, nil
}

// Members calls fn for each member of the object at the cursor, with the
// cursor on the member's value; fn must consume the value.
func (p *Scanner) Members(fn func(key string) error) error {
	if empty, err := p.open('{', '}'); empty || err != nil {
		return err
	}
	for {
		if p.Peek() != '"' {
			return p.Errorf("expected an object key")
		}
		key, err := p.Str()
		if err != nil {
			return err
		}
		if err := p.expect(':'); err != nil {
			return err
		}
		p.ws()
		if err := fn(key); err != nil {
			return err
		}
		switch p.Peek() {
		case ',':
			p.i++
		case '}':
			p.i++
			p.depth--
			return nil
		case 0:
			return ErrEnd
		default:
			return p.Errorf("expected ',' or '}' after object member %q", key)
		}
	}
}

// Elements calls fn for each element of the array at the cursor.
func (p *Scanner) Elements(fn func() error) error {
	if empty, err := p.open('[', ']'); empty || err != nil {
		return err
	}
	for {
		p.ws()
		if err := fn(); err != nil {
			return err
		}
		switch p.Peek() {
		case ',':
			p.i++
		case ']':
			p.i++
			p.depth--
			return nil
		case 0:
			return ErrEnd
		default:
			return p.Errorf("expected ',' or ']' in array")
		}
	}
}

// Str reads the string at the cursor and returns it unescaped. Strings
// without escapes (nearly all of them) are found with two IndexByte scans
// and returned as substrings. Raw control characters are passed through.
func (p *Scanner) Str() (string, error) {
	if p.Peek() != '"' {
		return "", p.Errorf("expected a string")
	}
	p.i++
	start := p.i
	j := quoteOrBackslash(p.s, start)
	if j < 0 {
		return "", ErrEnd
	}
	if p.s[j] == '\\' {
		p.i = j
		return p.strSlow(start)
	}
	p.i = j + 1
	return p.s[start:j], nil
}

// quoteOrBackslash returns the position of the first '"' or '\\' in s
// from i on, or -1. Most strings of an event are short: they are scanned
// eight bytes at a time (a zero byte of v^'"' or v^'\\' marks a hit);
// past 64 bytes without one, IndexByte's vector search takes over.
func quoteOrBackslash(s string, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for limit := min(len(s), i+64); i+8 <= limit; i += 8 {
		v := binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8))
		q, b := v^('"'*ones), v^('\\'*ones)
		// The lowest byte flagged is exact (false flags only sit above
		// a true zero byte).
		if m := ((q-ones)&^q | (b-ones)&^b) & highs; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	if i+8 <= len(s) {
		q := strings.IndexByte(s[i:], '"')
		if q < 0 {
			q = len(s) - i
		}
		if b := strings.IndexByte(s[i:i+q], '\\'); b >= 0 {
			return i + b
		}
		if q == len(s)-i {
			return -1
		}
		return i + q
	}
	for ; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			return i
		}
	}
	return -1
}

func (p *Scanner) strSlow(start int) (string, error) {
	var b strings.Builder
	b.Grow(p.i - start + 64)
	b.WriteString(p.s[start:p.i])
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c != '\\':
			b.WriteByte(c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.s) {
			return "", ErrEnd
		}
		e := p.s[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.Errorf("invalid \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A valid pair decodes to one rune; anything else is U+FFFD,
				// as encoding/json does.
				save := p.i
				if p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
					p.i += 2
					if r2, ok := p.hex4(); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							b.WriteRune(d)
							continue
						}
					}
				}
				p.i = save
				r = utf8.RuneError
			}
			b.WriteRune(r)
		default:
			return "", p.Errorf("invalid escape \\%c", e)
		}
	}
	return "", ErrEnd
}

func (p *Scanner) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(p.s[p.i : p.i+4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	p.i += 4
	return r, true
}

// skipString validates the escapes of a string and skips it without
// building it.
func (p *Scanner) skipString() error {
	p.i++ // opening quote
	for {
		j := strings.IndexByte(p.s[p.i:], '"')
		if j < 0 {
			return ErrEnd
		}
		k := strings.IndexByte(p.s[p.i:p.i+j], '\\')
		if k < 0 {
			p.i += j + 1
			return nil
		}
		p.i += k
		if p.i+1 >= len(p.s) {
			return ErrEnd
		}
		switch p.s[p.i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			p.i += 2
		case 'u':
			p.i += 2
			if _, ok := p.hex4(); !ok {
				return p.Errorf("invalid \\u escape")
			}
		default:
			return p.Errorf("invalid escape")
		}
	}
}

// skip validates and skips the value at the cursor.
func (p *Scanner) skip() error {
	switch c := p.Peek(); {
	case c == '"':
		return p.skipString()
	case c == '{':
		return p.Members(func(string) error { return p.skip() })
	case c == '[':
		return p.Elements(p.skip)
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case c == '-' || ('0' <= c && c <= '9'):
		_, err := p.Number()
		return err
	case c == 0:
		return ErrEnd
	default:
		return p.Errorf("unexpected %q", c)
	}
}

func (p *Scanner) literal(lit string) error {
	if !strings.HasPrefix(p.s[p.i:], lit) {
		return p.Errorf("invalid literal")
	}
	p.i += len(lit)
	return nil
}

// Null consumes a null at the cursor and reports whether there was one.
func (p *Scanner) Null() bool {
	if strings.HasPrefix(p.s[p.i:], "null") {
		p.i += 4
		return true
	}
	return false
}

// Number validates a JSON number and returns its text.
func (p *Scanner) Number() (string, error) {
	start := p.i
	if p.i < len(p.s) && p.s[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.i < len(p.s) && p.s[p.i] == '0' {
		p.i++
	} else if digits() == 0 {
		return "", p.Errorf("invalid number")
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return "", p.Errorf("invalid number")
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return "", p.Errorf("invalid number")
		}
	}
	return p.s[start:p.i], nil
}

// OptStr reads a string or null (as "").
func (p *Scanner) OptStr() (string, error) {
	if p.Peek() == 'n' && p.Null() {
		return "", nil
	}
	return p.Str()
}

// StrList reads an array of strings (or null), appending to dst.
func (p *Scanner) StrList(dst []string) ([]string, error) {
	if p.Peek() == 'n' && p.Null() {
		return dst, nil
	}
	err := p.Elements(func() error {
		s, err := p.OptStr()
		dst = append(dst, s)
		return err
	})
	return dst, err
}

// SkipFast skips the value at the cursor as skip does, accepting exactly
// what skip accepts, but in one loop without a call per member: it is
// how the decoder passes over requestObject, responseObject and the rest
// it does not keep, most of an event's bytes. On anything it does not
// accept it rewinds and lets skip find and name the problem.
func (p *Scanner) SkipFast() error {
	if end, ok := skipValue(p.s, p.i, maxDepth-p.depth); ok {
		p.i = end
		return nil
	}
	return p.skip()
}

// skipValue returns the end of the JSON value at s[i:] (after leading
// whitespace) and true, or false when s holds no valid value there or it
// nests deeper than room or 64 levels (skip handles deeper ones).
func skipValue(s string, i, room int) (int, bool) {
	var (
		depth   int
		objects uint64 // bit d: the container at depth d+1 is an object
	)
	ws := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r') {
			i++
		}
	}
value:
	ws()
	if i >= len(s) {
		return 0, false
	}
	switch c := s[i]; c {
	case '"':
		var ok bool
		if i, ok = skipStr(s, i+1); !ok {
			return 0, false
		}
	case '{', '[':
		if depth == 64 || depth == room {
			return 0, false
		}
		i++
		ws()
		if i < len(s) && s[i] == c+2 { // '}' is '{'+2, ']' is '['+2
			i++
			break
		}
		objects &^= 1 << depth
		if c == '{' {
			objects |= 1 << depth
		}
		depth++
		if c == '{' {
			goto key
		}
		goto value
	case 't':
		if !strings.HasPrefix(s[i:], "true") {
			return 0, false
		}
		i += 4
	case 'f':
		if !strings.HasPrefix(s[i:], "false") {
			return 0, false
		}
		i += 5
	case 'n':
		if !strings.HasPrefix(s[i:], "null") {
			return 0, false
		}
		i += 4
	default:
		var ok bool
		if i, ok = skipNumber(s, i); !ok {
			return 0, false
		}
	}
	// After a value: the end, or the next member or element.
	for {
		if depth == 0 {
			return i, true
		}
		ws()
		if i >= len(s) {
			return 0, false
		}
		inObject := objects&(1<<(depth-1)) != 0
		switch c := s[i]; {
		case c == ',':
			i++
			if inObject {
				goto key
			}
			goto value
		case c == '}' && inObject, c == ']' && !inObject:
			i++
			depth--
			continue
		}
		return 0, false
	}
key:
	ws()
	if i >= len(s) || s[i] != '"' {
		return 0, false
	}
	{
		var ok bool
		if i, ok = skipStr(s, i+1); !ok {
			return 0, false
		}
	}
	ws()
	if i >= len(s) || s[i] != ':' {
		return 0, false
	}
	i++
	goto value
}

// skipStr returns the end of the string whose content starts at s[i],
// after its closing quote, checking its escapes as skipString does.
func skipStr(s string, i int) (int, bool) {
	for {
		j := quoteOrBackslash(s, i)
		if j < 0 {
			return 0, false
		}
		if s[j] == '"' {
			return j + 1, true
		}
		if j+1 >= len(s) {
			return 0, false
		}
		switch s[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i = j + 2
		case 'u':
			if j+6 > len(s) {
				return 0, false
			}
			for _, c := range []byte(s[j+2 : j+6]) {
				if (c < '0' || c > '9') && (c|0x20 < 'a' || c|0x20 > 'f') {
					return 0, false
				}
			}
			i = j + 6
		default:
			return 0, false
		}
	}
}

// skipNumber returns the end of the JSON number at s[i], as number reads it.
func skipNumber(s string, i int) (int, bool) {
	digits := func() int {
		n := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if digits() == 0 {
		return 0, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return 0, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, false
		}
	}
	return i, true
}

// FirstStr reads an array of strings (or null) and returns its first
// element ("" when empty or null), building no list.
func (p *Scanner) FirstStr() (string, error) {
	if p.Peek() == 'n' && p.Null() {
		return "", nil
	}
	first, n := "", 0
	err := p.Elements(func() error {
		s, err := p.OptStr()
		if n == 0 {
			first = s
		}
		n++
		return err
	})
	return first, err
}

// Int32 reads an integer number that fits an int32 (null reads as 0).
func (p *Scanner) Int32() (int32, error) {
	if p.Peek() == 'n' && p.Null() {
		return 0, nil
	}
	s, err := p.Number()
	if err != nil {
		return 0, err
	}
	var n int64
	neg := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '-':
			neg = true
		case '0' <= c && c <= '9':
			n = n*10 + int64(c-'0')
			if n > 1<<31 {
				return 0, fmt.Errorf("number %s out of range", s)
			}
		default:
			return 0, fmt.Errorf("number %s is not an integer", s)
		}
	}
	if neg {
		n = -n
	}
	if n > 1<<31-1 || n < -1<<31 {
		return 0, fmt.Errorf("number %s out of range", s)
	}
	return int32(n), nil
}
