package store

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// bindNamed writes the values of args (driver.NamedValue, as
// clickhouse.Named makes them) into query in place of their @name
// placeholders, as the driver does for a server: a placeholder is @
// followed by letters, digits and _, outside string literals, quoted
// identifiers and comments; a string is quoted with backslash escapes,
// a number written in decimal. A placeholder without an argument is an
// error. The values are those the product binds: strings, booleans,
// integers and floats.
func bindNamed(query string, args []any) (string, error) {
	if len(args) == 0 {
		return query, nil
	}
	params := make(map[string]string, len(args))
	for _, a := range args {
		nv, ok := a.(driver.NamedValue)
		if !ok {
			return "", fmt.Errorf("bind %T: the in-process engine binds only named arguments (clickhouse.Named)", a)
		}
		v, err := literal(nv.Value)
		if err != nil {
			return "", fmt.Errorf("bind @%s: %w", nv.Name, err)
		}
		params[nv.Name] = v
	}
	var b strings.Builder
	b.Grow(len(query))
	var s quoteState
	for i := 0; i < len(query); i++ {
		if s.plain() && query[i] == '@' && i+1 < len(query) && isNameChar(query[i+1]) {
			j := i + 1
			for j < len(query) && isNameChar(query[j]) {
				j++
			}
			v, ok := params[query[i+1:j]]
			if !ok {
				return "", fmt.Errorf("have no arg for %q param", query[i:j])
			}
			b.WriteString(v)
			i = j - 1
			continue
		}
		next := s.step(query, i)
		b.WriteString(query[i : next+1])
		i = next
	}
	return b.String(), nil
}

var quoteReplacer = strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\x00", `\0`)

// quote writes s as a string literal.
func quote(s string) string { return "'" + quoteReplacer.Replace(s) + "'" }

// literal writes v as a ClickHouse literal.
func literal(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return quote(v), nil
	case bool:
		if v {
			return "1", nil
		}
		return "0", nil
	case int:
		return strconv.FormatInt(int64(v), 10), nil
	case int8:
		return strconv.FormatInt(int64(v), 10), nil
	case int16:
		return strconv.FormatInt(int64(v), 10), nil
	case int32:
		return strconv.FormatInt(int64(v), 10), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case uint:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint8:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint16:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint32:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "", fmt.Errorf("%v has no literal", v)
		}
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	}
	return "", fmt.Errorf("a %T has no literal here (strings, booleans, integers and floats do)", v)
}

func isNameChar(c byte) bool {
	return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// quoteState tracks where a scan of a query is: in a string literal, a
// quoted identifier, a comment (block comments nest), or plain SQL, where
// placeholders count.
type quoteState struct {
	quote   byte // ', ` or ", while inside
	line    bool
	comment int
}

func (s *quoteState) plain() bool { return s.quote == 0 && !s.line && s.comment == 0 }

// step consumes query[i] (and the byte after it when the two make one
// token) and returns the index of the last byte consumed.
func (s *quoteState) step(q string, i int) int {
	c := q[i]
	two := func(b byte) bool { return i+1 < len(q) && q[i+1] == b }
	switch {
	case s.line:
		s.line = c != '\n'
	case s.comment > 0:
		switch {
		case c == '/' && two('*'):
			s.comment++
			return i + 1
		case c == '*' && two('/'):
			s.comment--
			return i + 1
		}
	case s.quote != 0:
		switch {
		case c == '\\':
			if i+1 < len(q) {
				return i + 1 // an escaped byte
			}
		case c == s.quote && two(s.quote):
			return i + 1 // a doubled quote
		case c == s.quote:
			s.quote = 0
		}
	default:
		switch {
		case c == '\'' || c == '`' || c == '"':
			s.quote = c
		case c == '#':
			s.line = true
		case c == '-' && two('-'):
			s.line = true
			return i + 1
		case c == '/' && two('*'):
			s.comment++
			return i + 1
		}
	}
	return i
}
