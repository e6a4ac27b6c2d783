package audit

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math/bits"
	"strconv"
	"unsafe"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// What a write changed is defined here, once, for the field history, the
// lost-update findings and the field owners: an object as stored (the
// responseObject of a successful write) is a set of fields, each a path in
// the ConcurrencyPolicy path syntax (policy.ParseFieldPath) with a keyed
// hash of its value; a field changed from one version of an object to the
// next when its hashes differ. Values are never kept, only their hashes.
//
//   - Objects are walked member by member: `spec.replicas`,
//     `metadata.labels["app.kubernetes.io/name"]` (a member whose name is not
//     a plain field name is quoted).
//   - A list whose items are all objects with a distinct string `name`
//     (containers, env, ports, volumes) is walked item by item:
//     `spec.template.spec.containers[name=app].image`.
//   - Any other list is a set of items, `metadata.finalizers[*]`: the path
//     repeats once per item, each with the hash of that item, so a field's
//     value is the set of its hashes and an entry removed from the list is
//     a hash gone.
//   - An empty object or list, or null, has no fields: it reads as absent.
//   - Not fields: what the apiserver writes itself or derives
//     (objectSkipped), the whole `status` (the controllers' report, not
//     anyone's intent), and kubectl's last-applied annotation.
//
// A Scale (the /scale subresource) shows one field of its object,
// `spec.replicas`; it is a partial view, which the SQL knows by the
// subresource.

// MaxFields bounds the fields of one object; an object with more has no
// field history (ErrTooManyFields), rather than a partial one.
const MaxFields = 4096

// maxFieldDepth bounds the nesting walked.
const maxFieldDepth = 32

// ErrTooManyFields is returned for an object with more than MaxFields
// fields or nested deeper than maxFieldDepth.
var ErrTooManyFields = errors.New("object has too many fields for a field history")

// objectSkipped are the metadata members that are not fields: identity,
// stamps and what the apiserver maintains.
var objectSkipped = []string{"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
	"deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"}

// lastApplied is kubectl's copy of the last applied manifest: every
// field of it is a field of the object already.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// FieldHasher hashes field values under a key, so that a reader of the
// stored hashes cannot look small values up in a table made without the
// key. Every sink of one cluster must use the same key, or the same value
// hashes differently in two rows and reads as a change.
type FieldHasher struct{ k0, k1 uint64 }

// NewFieldHasher derives a hasher from a secret key of any length.
func NewFieldHasher(key []byte) FieldHasher {
	sum := sha256.Sum256(append([]byte("stampguard field history v1\x00"), key...))
	return FieldHasher{k0: binary.LittleEndian.Uint64(sum[0:8]), k1: binary.LittleEndian.Uint64(sum[8:16])}
}

// mix is a 64x64->128 bit multiply folded to 64 bits.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

const (
	p0 = 0xa0761d6478bd642f
	p1 = 0xe7037ed1a0b428db
	p2 = 0x8ebc6af09c88c6e3
)

// Sum is the keyed hash of a value's raw JSON text. It is never 0.
func (h FieldHasher) Sum(v []byte) uint64 {
	s := h.k0 ^ p0
	for len(v) >= 16 {
		s = mix(binary.LittleEndian.Uint64(v)^s^p1, binary.LittleEndian.Uint64(v[8:])^h.k1)
		v = v[16:]
	}
	var a, b uint64
	switch {
	case len(v) >= 8:
		a, b = binary.LittleEndian.Uint64(v), binary.LittleEndian.Uint64(v[len(v)-8:])
	case len(v) > 0:
		for i, c := range v {
			if i < 4 {
				a |= uint64(c) << (8 * i)
			} else {
				b |= uint64(c) << (8 * (i - 4))
			}
		}
	}
	s = mix(a^s^p1, b^h.k1^p2)
	s = mix(s^uint64(len(v)), p2^h.k0)
	if s == 0 {
		return 1
	}
	return s
}

// Fields is the field set of one stored object: Paths[i] has the hash
// Hashes[i]; a path repeats for the items of a set-like list.
type Fields struct {
	Paths  []string
	Hashes []uint64
}

// Reset empties f, keeping its memory.
func (f *Fields) Reset() { f.Paths, f.Hashes = f.Paths[:0], f.Hashes[:0] }

// Object appends the fields of obj, the raw JSON of an object as stored,
// to f. With scale obj is a Scale and only its spec.replicas is taken. On
// error f holds no fields.
func (h FieldHasher) Object(obj string, scale bool, f *Fields) error {
	f.Reset()
	data := rawjson.Trim(unsafe.Slice(unsafe.StringData(obj), len(obj)))
	// One valid JSON value, nothing after it: the walks below check only
	// what they read.
	end, err := rawjson.Skip(data, 0)
	if err == nil && end != len(data) {
		err = errors.New("data after the object")
	}
	if err != nil {
		f.Reset()
		return err
	}
	if scale {
		err = h.scale(data, f)
	} else {
		w := walker{h: h, f: f}
		err = rawjson.ObjectEach(data, func(key, v []byte) bool {
			name, ok := memberName(key)
			if !ok {
				w.err = errors.New("bad member name")
				return false
			}
			switch {
			case !plainName(name):
				// Not a Kubernetes field: a path starts with a field name.
			case name == "apiVersion", name == "kind", name == "status":
			case name == "metadata":
				w.metadata(v)
			default:
				w.value(name, v, 1)
			}
			return w.err == nil
		})
		if err == nil {
			err = w.err
		}
	}
	if err != nil {
		f.Reset()
	}
	return err
}

func (h FieldHasher) scale(data []byte, f *Fields) error {
	spec, found, err := rawjson.Member(data, "spec")
	if err != nil || !found || rawjson.Kind(spec) != '{' {
		return err
	}
	v, found, err := rawjson.Member(spec, "replicas")
	if err != nil || !found || rawjson.IsNull(v) {
		return err
	}
	f.Paths = append(f.Paths, "spec.replicas")
	f.Hashes = append(f.Hashes, h.Sum(rawjson.Trim(v)))
	return nil
}

type walker struct {
	h   FieldHasher
	f   *Fields
	err error
}

func (w *walker) metadata(v []byte) {
	if rawjson.Kind(v) != '{' {
		return
	}
	w.fail(rawjson.ObjectEach(v, func(key, v []byte) bool {
		name, ok := memberName(key)
		switch {
		case !ok:
			w.err = errors.New("bad member name in metadata")
		case name == "":
		case name == "annotations":
			w.annotations(v)
		default:
			for _, s := range objectSkipped {
				if name == s {
					return true
				}
			}
			w.value(join("metadata", name), v, 2)
		}
		return w.err == nil
	}))
}

func (w *walker) annotations(v []byte) {
	if rawjson.Kind(v) != '{' {
		w.value("metadata.annotations", v, 2)
		return
	}
	w.fail(rawjson.ObjectEach(v, func(key, v []byte) bool {
		name, ok := memberName(key)
		if !ok {
			w.err = errors.New("bad annotation name")
		} else if name != lastApplied && name != "" {
			w.value(join("metadata.annotations", name), v, 3)
		}
		return w.err == nil
	}))
}

func (w *walker) fail(err error) {
	if err != nil && w.err == nil {
		w.err = err
	}
}

// value walks the value v at path.
func (w *walker) value(path string, v []byte, depth int) {
	if depth > maxFieldDepth {
		w.fail(ErrTooManyFields)
		return
	}
	switch rawjson.Kind(v) {
	case 0, 'n':
	case '{':
		w.fail(rawjson.ObjectEach(v, func(key, v []byte) bool {
			name, ok := memberName(key)
			if !ok {
				w.err = errors.New("bad member name")
				return false
			}
			if name != "" { // a path cannot name an empty member
				w.value(join(path, name), v, depth+1)
			}
			return w.err == nil
		}))
	case '[':
		if names, ok := itemNames(v); ok {
			i := 0
			w.fail(rawjson.ArrayEach(v, func(item []byte) bool {
				w.value(path+"[name="+quoteKey(names[i])+"]", item, depth+1)
				i++
				return w.err == nil
			}))
			return
		}
		w.fail(rawjson.ArrayEach(v, func(item []byte) bool {
			if !rawjson.IsNull(item) {
				w.add(path+"[*]", item)
			}
			return w.err == nil
		}))
	default:
		w.add(path, v)
	}
}

func (w *walker) add(path string, v []byte) {
	if len(w.f.Paths) >= MaxFields {
		w.fail(ErrTooManyFields)
		return
	}
	w.f.Paths = append(w.f.Paths, path)
	w.f.Hashes = append(w.f.Hashes, w.h.Sum(rawjson.Trim(v)))
}

// itemNames returns the `name` of every item of the list v when every item
// is an object with a distinct, non-empty string name.
func itemNames(v []byte) ([]string, bool) {
	var names []string
	ok := true
	err := rawjson.ArrayEach(v, func(item []byte) bool {
		if rawjson.Kind(item) != '{' {
			ok = false
			return false
		}
		n, found, err := rawjson.Member(item, "name")
		if err != nil || !found || rawjson.Kind(n) != '"' {
			ok = false
			return false
		}
		s, err := rawjson.String(n)
		if err != nil || s == "" {
			ok = false
			return false
		}
		for _, o := range names {
			if o == s {
				ok = false
				return false
			}
		}
		names = append(names, s)
		return true
	})
	return names, ok && err == nil && len(names) > 0
}

// memberName decodes a raw quoted member name.
func memberName(key []byte) (string, bool) {
	s, err := rawjson.Unquote(key)
	return s, err == nil
}

// join appends the member name to path: `.name`, or `["name"]` when name
// is not a plain field name.
func join(path, name string) string {
	if plainName(name) {
		if path == "" {
			return name
		}
		return path + "." + name
	}
	return path + "[" + string(rawjson.AppendString(nil, name)) + "]"
}

// quoteKey writes the key value of a [name=value] selector: bare when it
// is a plain name, quoted otherwise.
func quoteKey(s string) string {
	if plainName(s) {
		return s
	}
	return string(rawjson.AppendString(nil, s))
}

// plainName reports whether s needs no quoting in a path: the field name
// characters of policy.ParseFieldPath.
func plainName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '_', c == '-', c == '$', c == '@', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}

// ObjectVersion parses a resourceVersion as the decimal integer that
// orders the versions of one object (Kubernetes 1.35, KEP-5504: versions
// of objects of one resource compare as integers). It returns 0, no
// version, for any other text.
func ObjectVersion(rv string) uint64 {
	if rv == "" || rv[0] == '0' || len(rv) > 20 {
		return 0
	}
	v, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// historyWrite reports whether r is a write with a field history: a
// successful create, update or patch, not a dry run, logged with its
// response (level RequestResponse) of an object whose bodies are not
// redacted, on the object itself or its status or scale.
func (d *Decoder) historyWrite(r *Row) bool {
	switch {
	case !r.Counted() || !r.Success() || r.DryRun || r.ResponseObject == "" || d.redacts(r.Resource):
		return false
	case r.Verb != "create" && r.Verb != "update" && r.Verb != "patch":
		return false
	}
	return r.Subresource == "" || r.Subresource == "status" || r.Subresource == "scale"
}

// history fills r's field history from its bodies.
func (d *Decoder) history(r *Row) {
	resp := unsafe.Slice(unsafe.StringData(r.ResponseObject), len(r.ResponseObject))
	if meta, found, err := rawjson.Member(resp, "metadata"); err == nil && found {
		if rv, found, err := rawjson.Member(meta, "resourceVersion"); err == nil && found {
			if s, err := rawjson.String(rv); err == nil {
				r.ObjectVersion = ObjectVersion(s)
			}
		}
	}
	r.Created = r.Code == 201
	scale := r.Subresource == "scale"
	r.FullView = d.History.Object(r.ResponseObject, scale, &r.Fields) == nil && !scale
	if r.Verb == "update" && r.RequestObject != "" {
		req := unsafe.Slice(unsafe.StringData(r.RequestObject), len(r.RequestObject))
		if meta, found, err := rawjson.Member(req, "metadata"); err == nil && found {
			if mf, found, err := rawjson.Member(meta, "managedFields"); err == nil && found && rawjson.Kind(mf) == '[' {
				r.RequestManaged = !isEmptyArray(mf)
			}
		}
	}
}

func isEmptyArray(v []byte) bool {
	empty := true
	_ = rawjson.ArrayEach(v, func([]byte) bool { empty = false; return false })
	return empty
}
