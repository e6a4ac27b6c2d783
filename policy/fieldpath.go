package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// segmentKind is one step of a field path.
type segmentKind uint8

const (
	segMember segmentKind = iota // .name or ["key"]: an object member
	segEach                      // [*]: every list item
	segSelect                    // [name=app]: the list item whose key field matches
)

type segment struct {
	kind     segmentKind
	name     string // member name, or the key field of a select
	keyValue string // the value a select's key field must have
}

// FieldPath is a parsed rule path such as
// spec.template.spec.containers[name=app].image or metadata.labels["team"].
type FieldPath struct {
	text     string
	segments []segment
}

// String returns the path as written in the policy.
func (p FieldPath) String() string { return p.text }

// ParseFieldPath parses the path syntax of ConcurrencyPolicy rules: dotted
// member names, ["key"] map keys, [*] for every list item and [key=value]
// for the list item whose key field has that value.
func ParseFieldPath(s string) (FieldPath, error) {
	p := FieldPath{text: s}
	if s == "" {
		return p, fmt.Errorf("empty path")
	}
	i := 0
	expectName := true
	for i < len(s) {
		switch s[i] {
		case '.':
			if expectName {
				return p, fmt.Errorf("path %q: empty name at offset %d", s, i)
			}
			i++
			expectName = true
		case '[':
			if expectName && i != 0 {
				return p, fmt.Errorf("path %q: '[' right after '.' at offset %d", s, i)
			}
			if i == 0 {
				return p, fmt.Errorf("path %q: must start with a field name", s)
			}
			seg, n, err := parseBracket(s[i:])
			if err != nil {
				return p, fmt.Errorf("path %q at offset %d: %w", s, i, err)
			}
			p.segments = append(p.segments, seg)
			i += n
			expectName = false
		default:
			if !expectName {
				return p, fmt.Errorf("path %q: expected '.' or '[' at offset %d", s, i)
			}
			j := i
			for j < len(s) && s[j] != '.' && s[j] != '[' {
				if !isNameByte(s[j]) {
					return p, fmt.Errorf("path %q: character %q at offset %d is not allowed in a field name (quote it: [\"...\"])", s, s[j], j)
				}
				j++
			}
			p.segments = append(p.segments, segment{kind: segMember, name: s[i:j]})
			i = j
			expectName = false
		}
	}
	if expectName {
		return p, fmt.Errorf("path %q: ends with '.'", s)
	}
	return p, nil
}

func isNameByte(c byte) bool {
	return c == '_' || c == '-' || c == '$' || c == '@' ||
		(c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// parseBracket parses one [...] segment at the start of s and returns how
// many bytes it used.
func parseBracket(s string) (segment, int, error) {
	end := closingBracket(s)
	if end < 0 {
		return segment{}, 0, fmt.Errorf("unterminated '['")
	}
	body := s[1:end]
	switch {
	case body == "*":
		return segment{kind: segEach}, end + 1, nil
	case strings.HasPrefix(body, `"`):
		key, err := rawjson.Unquote([]byte(body))
		if err != nil || key == "" {
			return segment{}, 0, fmt.Errorf("bad quoted key %s", body)
		}
		return segment{kind: segMember, name: key}, end + 1, nil
	default:
		field, value, ok := strings.Cut(body, "=")
		if !ok || field == "" || value == "" {
			return segment{}, 0, fmt.Errorf("bracket %q is none of [*], [\"key\"] or [field=value]", "["+body+"]")
		}
		for i := 0; i < len(field); i++ {
			if !isNameByte(field[i]) {
				return segment{}, 0, fmt.Errorf("bad key field %q in [%s]", field, body)
			}
		}
		if strings.HasPrefix(value, `"`) {
			v, err := rawjson.Unquote([]byte(value))
			if err != nil {
				return segment{}, 0, fmt.Errorf("bad quoted value %s", value)
			}
			value = v
		}
		return segment{kind: segSelect, name: field, keyValue: value}, end + 1, nil
	}
}

// closingBracket finds the ']' that closes the '[' at s[0], honouring quotes.
func closingBracket(s string) int {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch {
		case inQuote && s[i] == '\\':
			i++
		case s[i] == '"':
			inQuote = !inQuote
		case !inQuote && s[i] == ']':
			return i
		}
	}
	return -1
}

// Values returns the raw JSON values the path selects in doc, in document
// order. A missing member or list item selects nothing; it is not an error.
// Values of the wrong kind along the way (a string where an object was
// expected) also select nothing, as the field is then absent in the sense
// of this path.
func (p FieldPath) Values(doc []byte, out [][]byte) ([][]byte, error) {
	return p.walk(doc, 0, out)
}

func (p FieldPath) walk(v []byte, depth int, out [][]byte) ([][]byte, error) {
	if depth == len(p.segments) {
		if rawjson.IsNull(v) {
			return out, nil
		}
		return append(out, v), nil
	}
	seg := p.segments[depth]
	switch seg.kind {
	case segMember:
		if rawjson.Kind(v) != '{' {
			return out, nil
		}
		child, found, err := rawjson.Member(v, seg.name)
		if err != nil || !found {
			return out, err
		}
		return p.walk(child, depth+1, out)
	default:
		if rawjson.Kind(v) != '[' {
			return out, nil
		}
		var walkErr error
		err := rawjson.ArrayEach(v, func(item []byte) bool {
			if seg.kind == segSelect {
				if rawjson.Kind(item) != '{' {
					return true
				}
				key, found, err := rawjson.Member(item, seg.name)
				if err != nil {
					walkErr = err
					return false
				}
				if !found {
					return true
				}
				if k, err := rawjson.String(key); err != nil || k != seg.keyValue {
					return true
				}
			}
			out, walkErr = p.walk(item, depth+1, out)
			return walkErr == nil
		})
		if err != nil {
			return out, err
		}
		return out, walkErr
	}
}

// pathIs reports whether the path is exactly the dotted member path want.
func (p FieldPath) pathIs(want ...string) bool {
	if len(p.segments) != len(want) {
		return false
	}
	for i, seg := range p.segments {
		if seg.kind != segMember || seg.name != want[i] {
			return false
		}
	}
	return true
}

// HasPrefix reports whether p is prefix or lies below it: its first
// segments are prefix's (metadata.labels["team"] has the prefix
// metadata.labels and metadata.labels.team; metadata.labelsx has none).
func (p FieldPath) HasPrefix(prefix FieldPath) bool {
	return len(prefix.segments) <= len(p.segments) && slices.Equal(p.segments[:len(prefix.segments)], prefix.segments)
}
