package record

import (
	"cmp"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/stampguard/stampguard/internal/audit"
)

// What Set.add keeps of a row's strings (keyRoles, by position).
const (
	keySkip = iota
	keyAuditID
	keyStage
	keyAPIGroup
	keyResource
	keyNamespace
	keyName
)

var keyRoles = func() (roles [rowStrings]uint8) {
	for role, col := range map[uint8]int{keyAuditID: colAuditID, keyStage: colStage, keyAPIGroup: colAPIGroup,
		keyResource: colResource, keyNamespace: colNamespace, keyName: colName} {
		roles[stringPos(col)] = role
	}
	return roles
}()

// Set holds the rows and dead letters of records (spool records), parsed
// only as far as deduplication and the insert order need: each row's key,
// its stage time, its object and where its fields start in its record.
// The events columns are built straight from the records (Events.Load),
// so a row never becomes an audit.Row on its way from the spool to the
// insert. A Set shares memory with its records, which must not change
// while it is in use.
type Set struct {
	rows []rowRef
	dead []audit.DeadLetter
}

// NewSet returns an empty set with room for rows rows.
func NewSet(rows int) *Set { return &Set{rows: make([]rowRef, 0, rows)} }

// rowRef is one row of a record.
type rowRef struct {
	rec    string // the whole record
	off    int    // where the row's fields start in rec (after its tag)
	key    eventKey
	hash   uint64 // of key
	micros int64  // stage timestamp, Unix microseconds
	// The object, for the events sorting key.
	apiGroup, resource, namespace, name string
	// hist is where the row's history entry starts in rec (after its
	// tag), 0 for a row without one.
	hist int
}

// Rows is the number of rows in the set, repeats included.
func (s *Set) Rows() int { return len(s.rows) }

// Dead are the set's dead letters.
func (s *Set) Dead() []audit.DeadLetter { return s.dead }

// AddDead adds a dead letter.
func (s *Set) AddDead(d audit.DeadLetter) { s.dead = append(s.dead, d) }

// Add parses a record (AppendHeader, then AppendRow and AppendDeadLetter
// entries) and adds its rows and dead letters. A record that does not
// parse adds nothing.
func (s *Set) Add(rec string) error {
	nrows, ndead := len(s.rows), len(s.dead)
	if err := s.add(rec); err != nil {
		clear(s.rows[nrows:])
		s.rows, s.dead = s.rows[:nrows], s.dead[:ndead]
		return err
	}
	return nil
}

func (s *Set) add(rec string) error {
	first, lastRow := len(s.rows), -1 // lastRow: the previous entry's row, if it was one
	err := readRecord(rec, func(cluster string, d *recordReader) {
		lastRow = -1
		r := rowRef{rec: rec, off: d.i}
		r.key.cluster = cluster
		for _, role := range &keyRoles {
			if role == keySkip {
				d.skipStr()
				continue
			}
			switch role {
			case keyAuditID:
				r.key.auditID = d.str()
			case keyStage:
				r.key.stage = d.str()
			case keyAPIGroup:
				r.apiGroup = d.str()
			case keyResource:
				r.resource = d.str()
			case keyNamespace:
				r.namespace = d.str()
			case keyName:
				r.name = d.str()
			}
		}
		for range rowLists {
			for k := d.count(); k > 0; k-- {
				d.skipStr()
			}
		}
		t := d.tail()
		r.micros = t.stage
		r.key.fingerprint = t.fingerprint
		r.hash = r.key.hash()
		if d.err == nil {
			s.rows = append(s.rows, r)
			lastRow = len(s.rows) - 1
		}
	}, func(d *recordReader) {
		at := d.i
		var h History
		d.readHistory(&h, false)
		if d.err == nil && (lastRow < first || s.rows[lastRow].hist != 0) {
			d.err = errHistoryWithoutRow
		}
		if d.err == nil {
			s.rows[lastRow].hist = at
		}
		lastRow = -1
	}, func(dl audit.DeadLetter) { lastRow = -1; s.dead = append(s.dead, dl) })
	return err
}

var errHistoryWithoutRow = errors.New("spool record: a history entry that follows no row")

// eventKey identifies an event: (cluster, audit_id, stage, fingerprint),
// the identity every read takes once (analytics/sql.Identity).
type eventKey struct {
	cluster, auditID, stage string
	fingerprint             uint64
}

var keySeed = maphash.MakeSeed()

func (k *eventKey) hash() uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	var buf [8]byte
	for _, s := range [...]string{k.cluster, k.auditID, k.stage} {
		binary.LittleEndian.PutUint64(buf[:], uint64(len(s)))
		_, _ = h.Write(buf[:])
		_, _ = h.WriteString(s)
	}
	binary.LittleEndian.PutUint64(buf[:], k.fingerprint)
	_, _ = h.Write(buf[:])
	return h.Sum64()
}

// keyIndex finds rows by key: it maps a key's hash to the row's position,
// so that a lookup hashes nothing and compares the strings only on a hit.
// Two keys with one hash (about never) keep the first: the second is then
// never found, which can let a repeat of it through to the store, but
// never drops a row.
type keyIndex map[uint64]int32

// has reports whether rows (the rows idx indexes) hold r's key.
func (idx keyIndex) has(rows []rowRef, r *rowRef) bool {
	i, ok := idx[r.hash]
	return ok && rows[i].key == r.key
}

// dedup returns rows without those whose key an earlier row holds, and
// the index of what it returns. It does not change rows: when nothing is
// dropped it returns rows itself.
func dedup(rows []rowRef) ([]rowRef, keyIndex) {
	idx := make(keyIndex, len(rows))
	kept := rows
	copied := false
	for i := range rows {
		r := &rows[i]
		if idx.has(kept, r) {
			if !copied {
				kept = append(make([]rowRef, 0, len(rows)-1), rows[:i]...)
				copied = true
			}
			continue
		}
		if _, taken := idx[r.hash]; !taken {
			idx[r.hash] = int32(i)
			if copied {
				idx[r.hash] = int32(len(kept))
			}
		}
		if copied {
			kept = append(kept, *r)
		}
	}
	if !copied {
		return rows, idx
	}
	return kept, idx
}

// Events are the rows of a Set without repeats, in the events table's
// order: what one insert sends. They share memory with the set.
type Events struct {
	rows  []rowRef
	order []int32 // positions in rows, in the events_by_hour sorting key's order
}

// Events returns the set's rows, each key once (the first row that holds
// it), in the order of the events table's sorting key. It does not change
// the set, so a failed insert can be repeated with it.
func (s *Set) Events() Events {
	rows, _ := dedup(s.rows)
	return Events{rows: rows, order: eventOrder(rows)}
}

// Len is the number of distinct rows.
func (e Events) Len() int { return len(e.rows) }

// eventOrder returns the positions of rows in the order of the
// events_by_hour table's sorting key (cluster, intDiv(event_time_us,
// 3600000000), api_group, resource, namespace, name, event_time_us,
// audit_id, stage, fingerprint), strings compared bytewise as ClickHouse
// compares them. A block that arrives in this order is not sorted again by
// the server.
//
// Rows are sorted as small fixed-size keys: the cluster's rank, the hour,
// the object's rank among the batch's distinct objects, the time, and the
// first 16 bytes of the audit ID; only rows equal in all of that compare
// their strings.
func eventOrder(rows []rowRef) []int32 {
	type object struct{ cluster, apiGroup, resource, namespace, name string }
	ranks := map[object]uint32{}
	var objects []object
	keys := make([]orderKey, len(rows))
	for i := range rows {
		r := &rows[i]
		o := object{r.key.cluster, r.apiGroup, r.resource, r.namespace, r.name}
		k, ok := ranks[o]
		if !ok {
			k = uint32(len(objects))
			ranks[o] = k
			objects = append(objects, o)
		}
		keys[i] = orderKey{obj: k, row: int32(i), micros: uint64(r.micros)}
		keys[i].id0, keys[i].id1 = prefix16(r.key.auditID)
	}
	// Rank the objects by their own order.
	byName := make([]uint32, len(objects))
	for i := range byName {
		byName[i] = uint32(i)
	}
	slices.SortFunc(byName, func(a, b uint32) int {
		x, y := &objects[a], &objects[b]
		return cmp.Or(strings.Compare(x.cluster, y.cluster), strings.Compare(x.apiGroup, y.apiGroup),
			strings.Compare(x.resource, y.resource), strings.Compare(x.namespace, y.namespace),
			strings.Compare(x.name, y.name))
	})
	rank := make([]uint32, len(objects))
	clusterRank := make([]uint32, len(objects))
	var cl uint32
	for r, o := range byName {
		rank[o] = uint32(r)
		if r > 0 && objects[o].cluster != objects[byName[r-1]].cluster {
			cl++
		}
		clusterRank[o] = cl
	}
	for i := range keys {
		keys[i].cluster = clusterRank[keys[i].obj]
		keys[i].obj = rank[keys[i].obj]
	}
	slices.SortFunc(keys, func(a, b orderKey) int {
		if c := cmp.Compare(a.cluster, b.cluster); c != 0 {
			return c
		}
		if c := cmp.Compare(a.micros/3_600_000_000, b.micros/3_600_000_000); c != 0 {
			return c
		}
		if c := cmp.Compare(a.obj, b.obj); c != 0 {
			return c
		}
		if c := cmp.Compare(a.micros, b.micros); c != 0 {
			return c
		}
		if c := cmp.Compare(a.id0, b.id0); c != 0 {
			return c
		}
		if c := cmp.Compare(a.id1, b.id1); c != 0 {
			return c
		}
		x, y := &rows[a.row], &rows[b.row]
		return cmp.Or(strings.Compare(x.key.auditID, y.key.auditID), strings.Compare(x.key.stage, y.key.stage),
			cmp.Compare(x.key.fingerprint, y.key.fingerprint))
	})
	order := make([]int32, len(keys))
	for i := range keys {
		order[i] = keys[i].row
	}
	return order
}

type orderKey struct {
	cluster  uint32
	obj      uint32
	row      int32
	micros   uint64
	id0, id1 uint64 // the audit ID's first 16 bytes, big-endian, zero-padded
}

// prefix16 packs s's first 16 bytes so that comparing the numbers compares
// the bytes (a shorter string pads with zeros, which sorts it first unless
// it ends in NUL bytes; the full comparison after it settles those).
func prefix16(s string) (uint64, uint64) {
	var b [16]byte
	copy(b[:], s)
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}
