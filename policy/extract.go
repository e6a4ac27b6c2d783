package policy

import (
	"github.com/stampguard/stampguard/policy/internal/rawjson"
)

// pathTree merges every rule path of a set, so that one pass over an object
// yields the values of all of them. Each byte of the object is scanned once
// on the way down (list items matched by key are scanned once more).
type pathTree struct {
	members   map[string]*pathTree
	each      *pathTree
	selects   []selectNode
	terminals []int32 // indexes of the paths that end here
}

type selectNode struct {
	field, value string
	node         *pathTree
}

func (t *pathTree) add(p FieldPath, index int32) {
	n := t
	for _, seg := range p.segments {
		switch seg.kind {
		case segMember:
			if n.members == nil {
				n.members = map[string]*pathTree{}
			}
			child := n.members[seg.name]
			if child == nil {
				child = &pathTree{}
				n.members[seg.name] = child
			}
			n = child
		case segEach:
			if n.each == nil {
				n.each = &pathTree{}
			}
			n = n.each
		case segSelect:
			var child *pathTree
			for _, s := range n.selects {
				if s.field == seg.name && s.value == seg.keyValue {
					child = s.node
				}
			}
			if child == nil {
				child = &pathTree{}
				n.selects = append(n.selects, selectNode{field: seg.name, value: seg.keyValue, node: child})
			}
			n = child
		}
	}
	n.terminals = append(n.terminals, index)
}

// valueRef is one value found for path Path.
type valueRef struct {
	path  int32
	value []byte
}

// extract walks doc once and appends every value the tree's paths select.
// Null values count as absent.
func (t *pathTree) extract(doc []byte, out []valueRef) ([]valueRef, error) {
	if len(doc) == 0 {
		return out, nil
	}
	_, out, err := t.walk(doc, 0, out)
	return out, err
}

// walk reads the value at data[i:] and returns the index after it.
func (t *pathTree) walk(data []byte, i int, out []valueRef) (int, []valueRef, error) {
	start := skipWS(data, i)
	var end int
	var err error
	switch {
	case start < len(data) && data[start] == '{' && t.members != nil:
		end, out, err = t.walkObject(data, start, out)
	case start < len(data) && data[start] == '[' && (t.each != nil || t.selects != nil):
		end, out, err = t.walkArray(data, start, out)
	default:
		end, err = rawjson.Skip(data, start)
	}
	if err != nil {
		return 0, out, err
	}
	if len(t.terminals) > 0 && !rawjson.IsNull(data[start:end]) {
		for _, p := range t.terminals {
			out = append(out, valueRef{path: p, value: data[start:end]})
		}
	}
	return end, out, nil
}

func (t *pathTree) walkObject(data []byte, i int, out []valueRef) (int, []valueRef, error) {
	i = skipWS(data, i+1)
	if i < len(data) && data[i] == '}' {
		return i + 1, out, nil
	}
	for {
		kend, err := rawjson.Skip(data, i)
		if err != nil {
			return 0, out, err
		}
		if data[i] != '"' {
			return 0, out, rawjson.ErrSyntax
		}
		child := t.members[string(data[i+1:kend-1])]
		if child == nil && hasEscape(data[i:kend]) {
			if k, err := rawjson.Unquote(data[i:kend]); err == nil {
				child = t.members[k]
			}
		}
		i = skipWS(data, kend)
		if i >= len(data) || data[i] != ':' {
			return 0, out, rawjson.ErrSyntax
		}
		if child != nil {
			i, out, err = child.walk(data, i+1, out)
		} else {
			i, err = rawjson.Skip(data, i+1)
		}
		if err != nil {
			return 0, out, err
		}
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, out, rawjson.ErrSyntax
		}
		switch data[i] {
		case '}':
			return i + 1, out, nil
		case ',':
			i = skipWS(data, i+1)
		default:
			return 0, out, rawjson.ErrSyntax
		}
	}
}

func (t *pathTree) walkArray(data []byte, i int, out []valueRef) (int, []valueRef, error) {
	i = skipWS(data, i+1)
	if i < len(data) && data[i] == ']' {
		return i + 1, out, nil
	}
	for {
		var end int
		var err error
		if t.each != nil {
			end, out, err = t.each.walk(data, i, out)
		} else {
			end, err = rawjson.Skip(data, i)
		}
		if err != nil {
			return 0, out, err
		}
		if t.selects != nil && rawjson.Kind(data[i:end]) == '{' {
			item := data[i:end]
			for _, s := range t.selects {
				key, found, err := rawjson.Member(item, s.field)
				if err != nil {
					return 0, out, err
				}
				if k, err := rawjson.String(key); found && err == nil && k == s.value {
					if _, out, err = s.node.walk(item, 0, out); err != nil {
						return 0, out, err
					}
				}
			}
		}
		i = skipWS(data, end)
		if i >= len(data) {
			return 0, out, rawjson.ErrSyntax
		}
		switch data[i] {
		case ']':
			return i + 1, out, nil
		case ',':
			i = skipWS(data, i+1)
		default:
			return 0, out, rawjson.ErrSyntax
		}
	}
}

func skipWS(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t') {
		i++
	}
	return i
}

func hasEscape(rawKey []byte) bool {
	for _, c := range rawKey {
		if c == '\\' {
			return true
		}
	}
	return false
}

// valuesOf collects the values of one path from an extraction.
func valuesOf(refs []valueRef, path int32, out [][]byte) [][]byte {
	for _, r := range refs {
		if r.path == path {
			out = append(out, r.value)
		}
	}
	return out
}
