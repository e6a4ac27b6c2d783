package analytics

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
)

// RecordSet holds the rows and dead letters of encoded Batch records (spool
// records), parsed only as far as deduplication needs: each row's key, its
// stage time and where its fields start in its record. The Store builds the
// ClickHouse columns straight from the records, so a row never becomes a Row
// on its way from the spool to the insert. A RecordSet shares memory with
// its records, which must not change while it is in use.
type RecordSet struct {
	rows []rowRef
	dead []DeadLetter
}

// rowRef is one row of a record.
type rowRef struct {
	rec    string // the whole record
	off    int    // where the row's fields start in rec (after its tag)
	key    eventKey
	hash   uint64 // of key
	micros int64  // stage timestamp, Unix microseconds
}

// Rows is the number of rows in the set.
func (s *RecordSet) Rows() int { return len(s.rows) }

// Dead are the set's dead letters.
func (s *RecordSet) Dead() []DeadLetter { return s.dead }

// AddDead adds a dead letter.
func (s *RecordSet) AddDead(d DeadLetter) { s.dead = append(s.dead, d) }

// Add parses a record made by AppendBatch and adds its rows and dead
// letters. A record that does not parse adds nothing.
func (s *RecordSet) Add(rec string) error {
	nrows, ndead := len(s.rows), len(s.dead)
	if err := s.add(rec); err != nil {
		clear(s.rows[nrows:])
		s.rows, s.dead = s.rows[:nrows], s.dead[:ndead]
		return err
	}
	return nil
}

func (s *RecordSet) add(rec string) error {
	d := recordReader{s: rec}
	if v := d.byte(); v != recordVersion {
		return fmt.Errorf("spool record version %d, want %d", v, recordVersion)
	}
	cluster := d.str()
	for d.err == nil && d.i < len(d.s) {
		switch tag := d.byte(); tag {
		case tagRow:
			r := rowRef{rec: rec, off: d.i}
			r.key.cluster = cluster
			r.key.auditID = d.str()
			r.key.stage = d.str()
			for range rowStrings - 2 {
				d.skipStr()
			}
			for range rowLists {
				for k := d.count(); k > 0; k-- {
					d.skipStr()
				}
			}
			d.uvarint() // flags
			d.varint()  // code
			d.varint()  // request received
			r.micros = d.varint()
			r.key.fingerprint = d.uint64()
			r.hash = r.key.hash()
			if d.err == nil {
				s.rows = append(s.rows, r)
			}
		case tagDead:
			dl := DeadLetter{Cluster: cluster, Source: d.str(), Reason: d.str(), Raw: d.str(), ReceivedAt: d.varint()}
			if d.err == nil {
				s.dead = append(s.dead, dl)
			}
		default:
			if d.err == nil {
				d.err = fmt.Errorf("spool record: unknown entry tag %d", tag)
			}
		}
	}
	return d.err
}

// The strings and string lists of a row, in record order (AppendRow).
const (
	rowStrings = 23
	rowLists   = 5
)

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

// dedup returns rows without those whose key an earlier row holds and
// those drop reports, and the index of what it returns. It does not change
// rows: when nothing is dropped it returns rows itself.
func dedup(rows []rowRef, drop func(*rowRef) bool) ([]rowRef, keyIndex) {
	idx := make(keyIndex, len(rows))
	kept := rows
	copied := false
	for i := range rows {
		r := &rows[i]
		if (drop != nil && drop(r)) || idx.has(kept, r) {
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

func (d *recordReader) skipStr() {
	n := d.count()
	d.i += n
}

// recordSetOf encodes rows and dead letters into records (one per cluster)
// and parses them back: Store.Insert takes Rows through the same path as
// the spool's records.
func recordSetOf(rows []Row, dead []DeadLetter) (*RecordSet, error) {
	recs := map[string][]byte{}
	var order []string
	rec := func(cluster string) []byte {
		r, ok := recs[cluster]
		if !ok {
			r = AppendBatchHeader(nil, cluster)
			order = append(order, cluster)
		}
		return r
	}
	for i := range rows {
		recs[rows[i].Cluster] = AppendRow(rec(rows[i].Cluster), &rows[i])
	}
	for i := range dead {
		recs[dead[i].Cluster] = AppendDeadLetter(rec(dead[i].Cluster), &dead[i])
	}
	set := &RecordSet{}
	for _, c := range order {
		if err := set.Add(string(recs[c])); err != nil {
			return nil, err
		}
	}
	return set, nil
}
