package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/stampguard/stampguard/internal/rawjson"
	"slices"
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
	quoted       []byte // value as a JSON string, to compare without decoding
	node         *pathTree
	// withEach is node merged with the array's each node, so that an item
	// that matches is walked once for both.
	withEach *pathTree
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
				q, _ := json.Marshal(seg.keyValue)
				n.selects = append(n.selects, selectNode{field: seg.name, value: seg.keyValue, quoted: q, node: child})
			}
			n = child
		}
	}
	n.terminals = append(n.terminals, index)
}

// finish prepares the merged nodes; call it once all paths are added.
func (t *pathTree) finish() {
	for _, child := range t.members {
		child.finish()
	}
	if t.each != nil {
		t.each.finish()
	}
	for i := range t.selects {
		s := &t.selects[i]
		s.node.finish()
		s.withEach = s.node
		if t.each != nil {
			s.withEach = merge(t.each, s.node)
			s.withEach.finish()
		}
	}
}

// merge returns a tree that selects what a and b select.
func merge(a, b *pathTree) *pathTree {
	out := &pathTree{terminals: append(append([]int32(nil), a.terminals...), b.terminals...)}
	if a.members != nil || b.members != nil {
		out.members = map[string]*pathTree{}
		for k, v := range a.members {
			out.members[k] = v
		}
		for k, v := range b.members {
			if w, ok := out.members[k]; ok {
				out.members[k] = merge(w, v)
			} else {
				out.members[k] = v
			}
		}
	}
	switch {
	case a.each != nil && b.each != nil:
		out.each = merge(a.each, b.each)
	case a.each != nil:
		out.each = a.each
	default:
		out.each = b.each
	}
	for _, s := range append(append([]selectNode(nil), a.selects...), b.selects...) {
		out.selects = append(out.selects, selectNode{field: s.field, value: s.value, quoted: s.quoted, node: s.node})
	}
	return out
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
	var seenArr [8]*pathTree
	seen := seenArr[:0]
	i = skipWS(data, i+1)
	if i < len(data) && data[i] == '}' {
		return i + 1, out, nil
	}
	for {
		kend, err := rawjson.SkipString(data, i)
		if err != nil {
			return 0, out, err
		}
		key := data[i:kend]
		child := t.members[string(key[1:len(key)-1])]
		if child == nil && hasEscape(key) {
			if k, err := rawjson.Unquote(key); err == nil {
				child = t.members[k]
			}
		}
		i = skipWS(data, kend)
		if i >= len(data) || data[i] != ':' {
			return 0, out, rawjson.ErrSyntax
		}
		if child != nil {
			// A name read twice would leave its values ambiguous (the first
			// or the last?); the apiserver never sends one, so refuse it.
			if slices.Contains(seen, child) {
				return 0, out, fmt.Errorf("%w: member %s appears twice", rawjson.ErrSyntax, key)
			}
			seen = append(seen, child)
			i, out, err = child.walk(data, i+1, out)
		} else {
			i, err = rawjson.Skip(data, i+1)
		}
		if err != nil {
			return 0, out, err
		}
		var done bool
		if i, done, err = nextMember(data, i, '}'); done || err != nil {
			return i, out, err
		}
	}
}

// nextMember reads what follows a member or item at data[i:]: the closing
// byte (done, i after it) or a comma (i at the next member).
func nextMember(data []byte, i int, closing byte) (int, bool, error) {
	i = skipWS(data, i)
	if i >= len(data) {
		return 0, true, rawjson.ErrSyntax
	}
	switch data[i] {
	case closing:
		return i + 1, true, nil
	case ',':
		return skipWS(data, i+1), false, nil
	default:
		return 0, true, rawjson.ErrSyntax
	}
}

func (t *pathTree) walkArray(data []byte, i int, out []valueRef) (int, []valueRef, error) {
	i = skipWS(data, i+1)
	if i < len(data) && data[i] == ']' {
		return i + 1, out, nil
	}
	for {
		end, out2, err := t.walkItem(data, i, out)
		if err != nil {
			return 0, out, err
		}
		out = out2
		var done bool
		if i, done, err = nextMember(data, end, ']'); done || err != nil {
			return i, out, err
		}
	}
}

// walkItem reads one list item. An item that one select matches is walked
// once, with that select's tree merged with the each tree; only an item
// that several selects match is walked more than once.
func (t *pathTree) walkItem(data []byte, i int, out []valueRef) (int, []valueRef, error) {
	var matched *selectNode
	extra := 0
	if t.selects != nil && i < len(data) && data[i] == '{' {
		for k := range t.selects {
			s := &t.selects[k]
			ok, err := keyMatches(data[i:], s)
			if err != nil {
				return 0, out, err
			}
			if ok {
				if matched == nil {
					matched = s
				} else {
					extra++
				}
			}
		}
	}
	var end int
	var err error
	switch {
	case matched != nil:
		end, out, err = matched.withEach.walk(data, i, out)
	case t.each != nil:
		end, out, err = t.each.walk(data, i, out)
	default:
		end, err = rawjson.Skip(data, i)
	}
	if err != nil || extra == 0 {
		return end, out, err
	}
	item := data[i:end]
	for k := range t.selects {
		s := &t.selects[k]
		if s == matched {
			continue
		}
		if ok, _ := keyMatches(item, s); ok {
			if _, out, err = s.node.walk(item, 0, out); err != nil {
				return 0, out, err
			}
		}
	}
	return end, out, nil
}

// keyMatches reports whether the object starting at obj has s.field equal
// to s.value. The key field usually comes first (name in containers), so
// this reads little.
func keyMatches(obj []byte, s *selectNode) (bool, error) {
	key, found, err := rawjson.Member(obj, s.field)
	if err != nil || !found {
		return false, err
	}
	key = rawjson.Trim(key)
	if bytes.Equal(key, s.quoted) {
		return true, nil
	}
	if bytes.IndexByte(key, '\\') < 0 {
		return false, nil
	}
	v, err := rawjson.String(key)
	return err == nil && v == s.value, nil
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
