// Package rawjson reads just the parts of a JSON document that a caller asks
// for, without decoding the rest. Admission objects are tens of kilobytes and
// a rule needs a handful of values, so skipping is far cheaper than decoding.
//
// The scanner trusts neither its input nor its caller: malformed input yields
// an error, never a panic, and every loop advances.
package rawjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unsafe"
)

// ErrSyntax reports malformed JSON.
var ErrSyntax = errors.New("malformed JSON")

// maxDepth bounds nesting as the apiserver's own JSON decoding does:
// sigs.k8s.io/json (internal/golang/encoding/json/scanner.go,
// maxNestingDepth = 10000), which decodes custom resources, and
// k8s.io/apimachinery/pkg/util/json (maxDepth = 10000). A shallower bound
// would refuse objects the apiserver stores, such as a CRD's
// x-kubernetes-preserve-unknown-fields; deeper ones the apiserver refuses
// before admission. skipContainer keeps one byte per level, so the bound
// costs at most 10 KB per scan and nothing recurses on it.
const maxDepth = 10000

func syntaxErr(data []byte, i int, what string) error {
	return fmt.Errorf("%w: %s at offset %d of %d", ErrSyntax, what, i, len(data))
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// Trim drops surrounding white space.
func Trim(v []byte) []byte {
	i, j := 0, len(v)
	for i < j && isSpace(v[i]) {
		i++
	}
	for j > i && isSpace(v[j-1]) {
		j--
	}
	return v[i:j]
}

// skipString returns the index after the closing quote of the string whose
// opening quote is at i, its escapes checked as the Scanner checks them.
func skipString(data []byte, i int) (int, error) {
	// Most keys and values end within eight bytes: settle those with one
	// word test before the general loop.
	if i+9 <= len(data) {
		w := binary.LittleEndian.Uint64(data[i+1:])
		q, b := w^quotes, w^slashs
		mq, mb := (q-ones)&^q&highs, (b-ones)&^b&highs
		if mq != 0 && (mb == 0 || bits.TrailingZeros64(mq) < bits.TrailingZeros64(mb)) {
			return i + 2 + bits.TrailingZeros64(mq)/8, nil
		}
	}
	end, ok := skipStr(view(data), i+1)
	if !ok {
		return 0, syntaxErr(data, i, "unterminated string or a bad escape in it")
	}
	return end, nil
}

const (
	ones   = 0x0101010101010101
	highs  = 0x8080808080808080
	quotes = '"' * ones
	slashs = '\\' * ones
)

// view is data as a string, without a copy: the functions of this file
// only read their input.
func view(data []byte) string { return unsafe.String(unsafe.SliceData(data), len(data)) }

// Skip returns the index just after the JSON value that starts at or after i
// (leading white space is skipped). The value is validated whole, as the
// Scanner's SkipFast validates it.
func Skip(data []byte, i int) (int, error) {
	i = skipSpace(data, i)
	if i >= len(data) {
		return 0, syntaxErr(data, i, "unexpected end of input")
	}
	if end, ok := skipValue(view(data), i, maxDepth); ok {
		return end, nil
	}
	// skipValue names no problem and leaves values nested deeper than 64
	// levels to the Scanner, which names what it refuses.
	p := Scanner{s: view(data), i: i}
	if err := p.skip(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return p.i, nil
}

// ObjectEach calls fn for every member of the object in obj, with the raw
// (still quoted, possibly escaped) key and the raw value. fn returning false
// stops the walk.
func ObjectEach(obj []byte, fn func(key, value []byte) bool) error {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return syntaxErr(obj, i, "expected an object")
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return nil
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return syntaxErr(obj, i, "expected a member name")
		}
		kend, err := skipString(obj, i)
		if err != nil {
			return err
		}
		key := obj[i:kend]
		i = skipSpace(obj, kend)
		if i >= len(obj) || obj[i] != ':' {
			return syntaxErr(obj, i, "expected ':'")
		}
		vstart := skipSpace(obj, i+1)
		vend, err := Skip(obj, vstart)
		if err != nil {
			return err
		}
		if !fn(key, obj[vstart:vend]) {
			return nil
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) {
			return syntaxErr(obj, i, "unterminated object")
		}
		if obj[i] == '}' {
			return nil
		}
		if obj[i] != ',' {
			return syntaxErr(obj, i, "expected ',' or '}'")
		}
		i = skipSpace(obj, i+1)
	}
}

// ArrayEach calls fn for every element of the array in arr. fn returning
// false stops the walk.
func ArrayEach(arr []byte, fn func(value []byte) bool) error {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return syntaxErr(arr, i, "expected an array")
	}
	i = skipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		return nil
	}
	for {
		vend, err := Skip(arr, i)
		if err != nil {
			return err
		}
		if !fn(arr[i:vend]) {
			return nil
		}
		i = skipSpace(arr, vend)
		if i >= len(arr) {
			return syntaxErr(arr, i, "unterminated array")
		}
		if arr[i] == ']' {
			return nil
		}
		if arr[i] != ',' {
			return syntaxErr(arr, i, "expected ',' or ']'")
		}
		i = skipSpace(arr, i+1)
	}
}

// KeyIs reports whether the raw quoted key equals name.
func KeyIs(rawKey []byte, name string) bool {
	if len(rawKey) == len(name)+2 && string(rawKey[1:len(rawKey)-1]) == name {
		return true
	}
	if bytes.IndexByte(rawKey, '\\') < 0 {
		return false
	}
	s, err := Unquote(rawKey)
	return err == nil && s == name
}

// Member returns the raw value of the member name of the object in obj.
// A value that is not an object has no members.
func Member(obj []byte, name string) (value []byte, found bool, err error) {
	err = ObjectEach(obj, func(k, v []byte) bool {
		if KeyIs(k, name) {
			value, found = v, true
			return false
		}
		return true
	})
	return value, found, err
}

// IsNull reports whether v is the literal null or empty.
func IsNull(v []byte) bool {
	v = Trim(v)
	return len(v) == 0 || string(v) == "null"
}

// Kind returns the first byte class of v: '{', '[', '"', 'n' (null), 't'/'f'
// or '0' for numbers, 0 for nothing.
func Kind(v []byte) byte {
	v = Trim(v)
	if len(v) == 0 {
		return 0
	}
	switch c := v[0]; c {
	case '{', '[', '"', 'n', 't', 'f':
		return c
	default:
		return '0'
	}
}

// Unquote decodes a raw JSON string as the Scanner's Str does: escapes
// decoded (a lone surrogate becomes U+FFFD), everything else passed
// through. The common case, a string without escapes, costs one
// allocation.
func Unquote(raw []byte) (string, error) {
	raw = Trim(raw)
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", fmt.Errorf("%w: expected a string, got %.20q", ErrSyntax, raw)
	}
	body := raw[1 : len(raw)-1]
	if bytes.IndexByte(body, '\\') < 0 && bytes.IndexByte(body, '"') < 0 {
		return string(body), nil
	}
	p := Scanner{s: view(raw)}
	s, err := p.Str()
	if err == nil && p.i != len(raw) {
		err = p.Errorf("data after the string")
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return strings.Clone(s), nil
}

// String returns v as a string if it is a JSON string, "" if it is null or
// absent, and an error for any other kind of value.
func String(v []byte) (string, error) {
	if IsNull(v) {
		return "", nil
	}
	return Unquote(v)
}

// Bool returns v as a bool; null or absent is false.
func Bool(v []byte) (bool, error) {
	switch string(Trim(v)) {
	case "", "null", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, fmt.Errorf("%w: expected a boolean, got %.20q", ErrSyntax, v)
}

// Strings decodes an array of strings; null or absent is nil.
func Strings(v []byte) ([]string, error) {
	if IsNull(v) {
		return nil, nil
	}
	var out []string
	var err error
	walkErr := ArrayEach(v, func(e []byte) bool {
		var s string
		s, err = Unquote(e)
		out = append(out, s)
		return err == nil
	})
	if walkErr != nil {
		return nil, walkErr
	}
	return out, err
}

// Equal reports whether two raw JSON values are semantically equal: the same
// bytes are equal at once, anything else is compared decoded, so member order
// and white space do not matter. Absent and null are equal.
func Equal(a, b []byte) bool {
	a, b = Trim(a), Trim(b)
	if bytes.Equal(a, b) {
		return true
	}
	if IsNull(a) || IsNull(b) {
		return IsNull(a) && IsNull(b)
	}
	ka := Kind(a)
	if ka != Kind(b) {
		return false
	}
	switch ka {
	case '"':
		if bytes.IndexByte(a, '\\') < 0 && bytes.IndexByte(b, '\\') < 0 {
			return false // different bytes, no escapes: different strings
		}
	case 't', 'f', 'n':
		return false
	}
	var x, y any
	da := json.NewDecoder(bytes.NewReader(a))
	da.UseNumber()
	db := json.NewDecoder(bytes.NewReader(b))
	db.UseNumber()
	if da.Decode(&x) != nil || db.Decode(&y) != nil {
		return false
	}
	return equalValues(x, y)
}

func equalValues(x, y any) bool {
	switch xv := x.(type) {
	case map[string]any:
		yv, ok := y.(map[string]any)
		if !ok || len(xv) != len(yv) {
			return false
		}
		for k, v := range xv {
			w, ok := yv[k]
			if !ok || !equalValues(v, w) {
				return false
			}
		}
		return true
	case []any:
		yv, ok := y.([]any)
		if !ok || len(xv) != len(yv) {
			return false
		}
		for i := range xv {
			if !equalValues(xv[i], yv[i]) {
				return false
			}
		}
		return true
	case json.Number:
		yv, ok := y.(json.Number)
		if !ok {
			return false
		}
		if xv == yv {
			return true
		}
		fx, errx := strconv.ParseFloat(string(xv), 64)
		fy, erry := strconv.ParseFloat(string(yv), 64)
		return errx == nil && erry == nil && fx == fy
	default:
		return x == y
	}
}

// ObjectScan walks the members of the object in obj like ObjectEach, but
// hands fn the whole input and the offset where the member's value starts;
// fn reads the value itself and returns the offset just after it. This lets
// a caller extract from a large value in the same pass that delimits it.
// It returns the offset just after the object.
func ObjectScan(obj []byte, fn func(key, data []byte, start int) (end int, err error)) (int, error) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return 0, syntaxErr(obj, i, "expected an object")
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return 0, syntaxErr(obj, i, "expected a member name")
		}
		kend, err := skipString(obj, i)
		if err != nil {
			return 0, err
		}
		key := obj[i:kend]
		i = skipSpace(obj, kend)
		if i >= len(obj) || obj[i] != ':' {
			return 0, syntaxErr(obj, i, "expected ':'")
		}
		vend, err := fn(key, obj, skipSpace(obj, i+1))
		if err != nil {
			return 0, err
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) {
			return 0, syntaxErr(obj, i, "unterminated object")
		}
		if obj[i] == '}' {
			return i + 1, nil
		}
		if obj[i] != ',' {
			return 0, syntaxErr(obj, i, "expected ',' or '}'")
		}
		i = skipSpace(obj, i+1)
	}
}

// SkipString returns the index just after the string whose opening quote is
// at data[i].
func SkipString(data []byte, i int) (int, error) {
	if i >= len(data) || data[i] != '"' {
		return 0, syntaxErr(data, i, "expected a string")
	}
	return skipString(data, i)
}

// AppendString appends s as a JSON string. Unlike encoding/json it leaves
// <, > and & alone: the output is for machines, not HTML.
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
