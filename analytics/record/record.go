package record

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"

	"github.com/stampguard/stampguard/internal/audit"
)

// recordVersion is the first byte of every record; the reader refuses
// versions it does not know rather than misreading them.
const recordVersion = 1

var errShortRecord = errors.New("spool record truncated")

// A record is the version byte, the cluster, then entries until its end:
// a tag byte (tagRow or tagDead) and the entry. Entries are appended one at
// a time, so a row can be encoded while its strings still point into the
// reader's buffer.
const (
	tagRow  = 1
	tagDead = 2
)

// AppendHeader starts a record for cluster: the rows and dead letters
// accepted from one request (or one chunk of a file) of one cluster
// follow it, appended by AppendRow and AppendDeadLetter.
func AppendHeader(dst []byte, cluster string) []byte {
	dst = append(dst, recordVersion)
	return appendString(dst, cluster)
}

// AppendDeadLetter adds a dead letter to a record.
func AppendDeadLetter(dst []byte, d *audit.DeadLetter) []byte {
	dst = append(dst, tagDead)
	dst = appendString(dst, d.Source)
	dst = appendString(dst, d.Reason)
	dst = appendString(dst, d.Raw)
	return binary.AppendVarint(dst, d.ReceivedAt)
}

// AppendRow adds a row to a record (its Cluster is the record's), in the
// row layout below.
func AppendRow(dst []byte, r *audit.Row) []byte {
	dst = append(dst, tagRow)
	for _, f := range &rowStringFields {
		dst = appendString(dst, *f.str(r))
	}
	for _, f := range &rowListFields {
		l := *f.list(r)
		dst = binary.AppendUvarint(dst, uint64(len(l)))
		for _, s := range l {
			dst = appendString(dst, s)
		}
	}
	return tailOf(r).appendTo(dst)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// readRecord is the one parser of a record's entries: it checks the
// version and reads the cluster, then calls row with the reader at the
// start of each row's fields (row must read them all, in the row
// layout) and dead with each dead letter. Set.Add takes every record
// through it; the columns read a row's fields again from where Set.Add
// saw them start.
func readRecord(rec string, row func(cluster string, d *recordReader), dead func(audit.DeadLetter)) error {
	d := recordReader{s: rec}
	if v := d.byte(); v != recordVersion {
		return fmt.Errorf("spool record version %d, want %d", v, recordVersion)
	}
	cluster := d.str()
	for d.err == nil && d.i < len(d.s) {
		switch tag := d.byte(); tag {
		case tagRow:
			row(cluster, &d)
		case tagDead:
			dl := audit.DeadLetter{Cluster: cluster, Source: d.str(), Reason: d.str(), Raw: d.str(), ReceivedAt: d.varint()}
			if d.err == nil {
				dead(dl)
			}
		default:
			if d.err == nil {
				d.err = fmt.Errorf("spool record: unknown entry tag %d", tag)
			}
		}
	}
	return d.err
}

type recordReader struct {
	s   string
	i   int
	err error
}

func (d *recordReader) fail() {
	if d.err == nil {
		d.err = errShortRecord
	}
	d.i = len(d.s)
}

func (d *recordReader) byte() byte {
	if d.i >= len(d.s) {
		d.fail()
		return 0
	}
	d.i++
	return d.s[d.i-1]
}

func (d *recordReader) uvarint() uint64 {
	var x uint64
	var s uint
	for k := 0; k < binary.MaxVarintLen64; k++ {
		if d.i >= len(d.s) {
			d.fail()
			return 0
		}
		c := d.s[d.i]
		d.i++
		if c < 0x80 {
			return x | uint64(c)<<s
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	d.fail()
	return 0
}

func (d *recordReader) varint() int64 {
	ux := d.uvarint()
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// count reads a length and checks it against the bytes left, so a corrupt
// record cannot make us allocate absurd slices.
func (d *recordReader) count() int {
	n := d.uvarint()
	if n > uint64(len(d.s)-d.i) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *recordReader) str() string {
	n := d.count()
	s := d.s[d.i : d.i+n]
	d.i += n
	return s
}

func (d *recordReader) skipStr() {
	n := d.count()
	d.i += n
}

func (d *recordReader) uint64() uint64 {
	if d.i+8 > len(d.s) {
		d.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64([]byte(d.s[d.i : d.i+8]))
	d.i += 8
	return v
}

// A row's layout in its record is defined here, once: first its strings
// (rowStringFields), then its string lists (rowListFields), in this order,
// each with the Row field it holds and the events column it fills; then
// its rowTail. AppendRow (Row to record), Set.add (record to key) and
// block.appendRow (record to columns) all follow these tables, so a new
// field is one row here (and its column in columnTable, below).
//
// A string is its length (uvarint) and its bytes; a list is its length
// and its strings.

// rowField is one string (or one list) of a row: where the Row holds it
// and the events column it fills. An offset rather than an accessor
// function keeps the encoders free of a call per field (about a tenth of
// AppendRow's time); TestRowLayoutNamesRowFields checks each offset.
type rowField struct {
	off uintptr // of the field in audit.Row
	col int     // its column in columnTable
}

// str is the string field f of r.
func (f rowField) str(r *audit.Row) *string { return (*string)(unsafe.Add(unsafe.Pointer(r), f.off)) }

// list is the list field f of r.
func (f rowField) list(r *audit.Row) *[]string {
	return (*[]string)(unsafe.Add(unsafe.Pointer(r), f.off))
}

var layoutRow audit.Row // only for unsafe.Offsetof

var rowStringFields = [...]rowField{
	{unsafe.Offsetof(layoutRow.AuditID), colAuditID},
	{unsafe.Offsetof(layoutRow.Stage), colStage},
	{unsafe.Offsetof(layoutRow.Level), colLevel},
	{unsafe.Offsetof(layoutRow.Verb), colVerb},
	{unsafe.Offsetof(layoutRow.RequestURI), colRequestURI},
	{unsafe.Offsetof(layoutRow.User), colUser},
	{unsafe.Offsetof(layoutRow.ImpersonatedUser), colImpersonatedUser},
	{unsafe.Offsetof(layoutRow.UserAgent), colUserAgent},
	{unsafe.Offsetof(layoutRow.SourceIP), colSourceIP},
	{unsafe.Offsetof(layoutRow.APIGroup), colAPIGroup},
	{unsafe.Offsetof(layoutRow.APIVersion), colAPIVersion},
	{unsafe.Offsetof(layoutRow.Resource), colResource},
	{unsafe.Offsetof(layoutRow.Subresource), colSubresource},
	{unsafe.Offsetof(layoutRow.Namespace), colNamespace},
	{unsafe.Offsetof(layoutRow.Name), colName},
	{unsafe.Offsetof(layoutRow.ObjectUID), colObjectUID},
	{unsafe.Offsetof(layoutRow.Stamp), colStamp},
	{unsafe.Offsetof(layoutRow.FieldManager), colFieldManager},
	{unsafe.Offsetof(layoutRow.Reason), colReason},
	{unsafe.Offsetof(layoutRow.Message), colMessage},
	{unsafe.Offsetof(layoutRow.AuthzDecision), colAuthzDecision},
	{unsafe.Offsetof(layoutRow.LeaseHolder), colLeaseHolder},
	{unsafe.Offsetof(layoutRow.Raw), colRaw}, // empty unless the store keeps raw
}

var rowListFields = [...]rowField{
	{unsafe.Offsetof(layoutRow.UserGroups), colUserGroups},
	{unsafe.Offsetof(layoutRow.CauseReasons), colCauseReasons},
	{unsafe.Offsetof(layoutRow.CauseFields), colCauseFields},
	{unsafe.Offsetof(layoutRow.AnnotationKeys), colAnnotationKeys},
	{unsafe.Offsetof(layoutRow.AnnotationValues), colAnnotationValues},
}

// The number of strings and string lists of a row.
const (
	rowStrings = len(rowStringFields)
	rowLists   = len(rowListFields)
)

// rowTail is what follows a row's lists in its record: the flags (bit 0:
// DryRun) and Code, RequestReceivedMicros, StageMicros as varints, then
// the Fingerprint as 8 bytes little endian.
type rowTail struct {
	flags                 uint64
	code, received, stage int64
	fingerprint           uint64
}

func tailOf(r *audit.Row) rowTail {
	t := rowTail{code: int64(r.Code), received: r.RequestReceivedMicros, stage: r.StageMicros, fingerprint: r.Fingerprint}
	if r.DryRun {
		t.flags = 1
	}
	return t
}

func (t rowTail) appendTo(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, t.flags)
	dst = binary.AppendVarint(dst, t.code)
	dst = binary.AppendVarint(dst, t.received)
	dst = binary.AppendVarint(dst, t.stage)
	return binary.LittleEndian.AppendUint64(dst, t.fingerprint)
}

func (d *recordReader) tail() rowTail {
	return rowTail{flags: d.uvarint(), code: d.varint(), received: d.varint(), stage: d.varint(), fingerprint: d.uint64()}
}

func (t rowTail) setOn(r *audit.Row) {
	r.DryRun = t.flags&1 == 1
	r.Code = int32(t.code)
	r.RequestReceivedMicros = t.received
	r.StageMicros = t.stage
	r.Fingerprint = t.fingerprint
}

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

// The positions of the strings block.appendRow reads by name.
var (
	strUser         = stringPos(colUser)
	strImpersonated = stringPos(colImpersonatedUser)
)

// stringPos is the position of column col's string in a row's record.
func stringPos(col int) int {
	for i, f := range rowStringFields {
		if f.col == col {
			return i
		}
	}
	panic(fmt.Sprintf("record: column %d is no string of a row's record", col))
}

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
	return readRecord(rec, func(cluster string, d *recordReader) {
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
		}
	}, func(dl audit.DeadLetter) { s.dead = append(s.dead, dl) })
}

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

// The insert side: the events column table, defined once, and the native
// ClickHouse blocks built straight from a Set's records.

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

// block builds one events insert block in ClickHouse's native
// column format straight from spool records: no Row per event, no boxing
// of values, and LowCardinality dictionaries kept in typed maps. The
// driver's own append path costs about three times as much CPU per event
// (reflection and a map[any]int per LowCardinality value).
//
// The finished columns are loaded into the driver's batch with Decode, the
// same call that reads a block from the server, so the driver sends exactly
// the bytes built here. load checks the types the server asked for first.
type block struct {
	n       int
	cols    [len(columnTable)]nativeColumn
	scratch []byte // a LowCardinality column's encoding, one at a time
}

// columnTable is the events insert's column table, defined here once:
// each column's name and type as the events table declares them
// (migration 1), in the order the insert sends them. The col* constants
// below are positions in it, and the row layout (rowStringFields and
// rowListFields, above) says which of a row's fields fills which column.
var columnTable = [...]struct{ name, typ string }{
	{"event_date", "Date"},
	{"event_time", "DateTime"},
	{"event_time_us", "UInt64"},
	{"request_received_us", "UInt64"},
	{"latency_us", "UInt64"},
	{"cluster", lcString},
	{"audit_id", "String"},
	{"stage", lcString},
	{"fingerprint", "UInt64"},
	{"level", lcString},
	{"verb", lcString},
	{"request_uri", "String"},
	{"dry_run", "UInt8"},
	{"user", lcString},
	{"user_groups", "Array(String)"},
	{"impersonated_user", lcString},
	{"writer", lcString},
	{"user_agent", lcString},
	{"source_ip", "String"},
	{"api_group", lcString},
	{"api_version", lcString},
	{"resource", lcString},
	{"subresource", lcString},
	{"namespace", lcString},
	{"name", "String"},
	{"object_uid", "String"},
	{"stamp", "String"},
	{"field_manager", lcString},
	{"code", "UInt16"},
	{"reason", lcString},
	{"message", "String"},
	{"cause_reasons", "Array(String)"},
	{"cause_fields", "Array(String)"},
	{"authz_decision", lcString},
	{"annotation_keys", "Array(String)"},
	{"annotation_values", "Array(String)"},
	{"lease_holder", "String"},
	{"raw", "String"},
}

// EventColumns is the events insert's column list, in the order the blocks
// hold them ("event_date, event_time, ...").
var EventColumns = func() string {
	names := make([]string, len(columnTable))
	for i, c := range columnTable {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}()

const lcString = "LowCardinality(String)"

// Column positions in columnTable.
const (
	colDate = iota
	colTime
	colTimeUS
	colReceivedUS
	colLatencyUS
	colCluster
	colAuditID
	colStage
	colFingerprint
	colLevel
	colVerb
	colRequestURI
	colDryRun
	colUser
	colUserGroups
	colImpersonatedUser
	colWriter
	colUserAgent
	colSourceIP
	colAPIGroup
	colAPIVersion
	colResource
	colSubresource
	colNamespace
	colName
	colObjectUID
	colStamp
	colFieldManager
	colCode
	colReason
	colMessage
	colCauseReasons
	colCauseFields
	colAuthzDecision
	colAnnotationKeys
	colAnnotationValues
	colLeaseHolder
	colRaw
)

// recordStringLC says, by position in a row's record, which strings go
// to a LowCardinality column.
var recordStringLC = func() (lc [rowStrings]bool) {
	for i, f := range rowStringFields {
		lc[i] = columnTable[f.col].typ == lcString
	}
	return lc
}()

var columnsPool = sync.Pool{New: func() any { return newBlock() }}

func newBlock() *block {
	b := &block{}
	for i, c := range columnTable {
		switch c.typ {
		case lcString:
			b.cols[i].dict = map[string]uint32{}
		case "Array(String)":
			b.cols[i].array = true
		case "String":
			b.cols[i].plain = true
		}
	}
	return b
}

// reset empties the columns and keeps their memory.
func (c *block) reset() {
	c.n = 0
	for i := range c.cols {
		c.cols[i].reset()
	}
}

// nativeColumn is one column being built: data holds fixed-width values,
// strings (length-prefixed), or an array's elements; an array keeps its
// offsets apart; a LowCardinality column keeps a dictionary and one key
// per row.
type nativeColumn struct {
	array bool
	data  []byte
	// A String column keeps its values as they are (they point into the
	// records) and hands them to the driver's column with its Append:
	// encoding them here only for the driver to parse them back, a
	// varint and a copy per value, was a quarter of the columns' CPU.
	plain   bool
	strs    []string
	offsets []byte
	total   uint64 // array elements so far

	dict    map[string]uint32
	values  []string // the dictionary in key order; values[0] is ""
	keys    []uint32
	last    string // the previous row's value and key: runs are common
	lastKey uint32
	hasLast bool
}

func (c *nativeColumn) reset() {
	c.data, c.offsets, c.total = c.data[:0], c.offsets[:0], 0
	clear(c.strs) // do not keep the records alive
	c.strs = c.strs[:0]
	if c.dict != nil {
		clear(c.dict)
		clear(c.values)
		c.values, c.keys = c.values[:0], c.keys[:0]
		c.last, c.lastKey, c.hasLast = "", 0, false
	}
	// Do not pin huge buffers of a rare large batch for good.
	if cap(c.data) > 64<<20 {
		c.data = nil
	}
}

func (c *nativeColumn) str(s string) {
	if c.plain {
		c.strs = append(c.strs, s)
		return
	}
	c.data = binary.AppendUvarint(c.data, uint64(len(s)))
	c.data = append(c.data, s...)
}

func (c *nativeColumn) lc(s string) {
	if c.hasLast && s == c.last {
		c.keys = append(c.keys, c.lastKey)
		return
	}
	if len(c.values) == 0 {
		// Like the driver, start the dictionary with the default value.
		c.values = append(c.values, "")
		c.dict[""] = 0
	}
	k, ok := c.dict[s]
	if !ok {
		k = uint32(len(c.values))
		c.values = append(c.values, s)
		c.dict[s] = k
	}
	c.keys = append(c.keys, k)
	c.last, c.lastKey, c.hasLast = s, k, true
}

func (c *nativeColumn) u8(v uint8)   { c.data = append(c.data, v) }
func (c *nativeColumn) u16(v uint16) { c.data = binary.LittleEndian.AppendUint16(c.data, v) }
func (c *nativeColumn) u32(v uint32) { c.data = binary.LittleEndian.AppendUint32(c.data, v) }
func (c *nativeColumn) u64(v uint64) { c.data = binary.LittleEndian.AppendUint64(c.data, v) }

// endArray closes a row of an array column after its elements went to data.
func (c *nativeColumn) endArray(elems int) {
	c.total += uint64(elems)
	c.offsets = binary.LittleEndian.AppendUint64(c.offsets, c.total)
}

// LowCardinality serialization (ClickHouse's SerializationLowCardinality,
// as the driver writes it): one flags word saying the block carries its own
// dictionary ("additional keys") and the key width, the dictionary, then
// the keys.
const (
	lcHasAdditionalKeys = 1 << 9
	lcUpdateDictionary  = 1 << 10
)

// reader returns the column's native encoding; a LowCardinality column
// is encoded into scratch.
func (c *nativeColumn) reader(rows int, scratch *[]byte) io.Reader {
	switch {
	case c.dict != nil:
		var key uint64 // key width: 0 is UInt8, 1 UInt16, 2 UInt32
		switch n := len(c.values); {
		case n <= math.MaxUint8+1:
			key = 0
		case n <= math.MaxUint16+1:
			key = 1
		default:
			key = 2
		}
		b := binary.LittleEndian.AppendUint64((*scratch)[:0], lcHasAdditionalKeys|lcUpdateDictionary|key)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(c.values)))
		for _, v := range c.values {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(rows))
		switch key {
		case 0:
			for _, k := range c.keys {
				b = append(b, uint8(k))
			}
		case 1:
			for _, k := range c.keys {
				b = binary.LittleEndian.AppendUint16(b, uint16(k))
			}
		default:
			for _, k := range c.keys {
				b = binary.LittleEndian.AppendUint32(b, k)
			}
		}
		*scratch = b
		return bytes.NewReader(b)
	case c.array:
		return io.MultiReader(bytes.NewReader(c.offsets), bytes.NewReader(c.data))
	case c.plain:
		b := (*scratch)[:0]
		for _, s := range c.strs {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		*scratch = b
		return bytes.NewReader(b)
	}
	return bytes.NewReader(c.data)
}

// appendRow decodes one row of a record (its fields start at r.off) onto
// the columns. keepRaw stores the raw column; without it raw is empty.
func (c *block) appendRow(r *rowRef, keepRaw bool) error {
	d := recordReader{s: r.rec, i: r.off}
	var strs [rowStrings]string
	for i := range strs {
		strs[i] = d.str()
	}
	cols := &c.cols
	for _, f := range &rowListFields {
		k := d.count()
		col := &cols[f.col]
		for range k {
			col.str(d.str())
		}
		col.endArray(k)
	}
	t := d.tail()
	if d.err != nil {
		return fmt.Errorf("spool record row: %w", d.err)
	}
	for i, f := range &rowStringFields {
		switch {
		case f.col == colRaw:
			if !keepRaw {
				strs[i] = ""
			}
			cols[f.col].str(strs[i])
		case recordStringLC[i]:
			cols[f.col].lc(strs[i])
		default:
			cols[f.col].str(strs[i])
		}
	}
	writer := strs[strImpersonated]
	if writer == "" {
		writer = strs[strUser]
	}
	cols[colWriter].lc(writer)
	cols[colCluster].lc(r.key.cluster)

	secs := floorDiv(t.stage, 1e6)
	cols[colDate].u16(uint16(floorDiv(secs, 86400)))
	cols[colTime].u32(uint32(secs))
	cols[colTimeUS].u64(uint64(t.stage))
	cols[colReceivedUS].u64(uint64(t.received))
	var latency int64
	if t.received != 0 && t.stage >= t.received {
		latency = t.stage - t.received
	}
	cols[colLatencyUS].u64(uint64(latency))
	cols[colFingerprint].u64(t.fingerprint)
	cols[colDryRun].u8(uint8(t.flags & 1))
	cols[colCode].u16(uint16(t.code))
	c.n++
	return nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// load decodes the built columns into the driver's batch columns, after
// checking that the server asked for the types built here.
func (c *block) load(dst []column.Interface) error {
	if len(dst) != len(c.cols) {
		return fmt.Errorf("events insert: the server asked for %d columns, want %d", len(dst), len(c.cols))
	}
	for i, col := range dst {
		if got := string(col.Type()); got != columnTable[i].typ {
			return fmt.Errorf("events insert: column %s is %s, want %s", col.Name(), got, columnTable[i].typ)
		}
		if sc, ok := col.(*column.String); ok && c.cols[i].plain {
			if _, err := sc.Append(c.cols[i].strs); err != nil {
				return fmt.Errorf("events insert: load column %s: %w", col.Name(), err)
			}
			continue
		}
		if err := col.Decode(proto.NewReader(c.cols[i].reader(c.n, &c.scratch)), c.n); err != nil {
			return fmt.Errorf("events insert: load column %s: %w", col.Name(), err)
		}
	}
	return nil
}

// Load builds the events blocks of e, at most maxRows rows a block, and
// loads each into the columns of the driver's batch (the server's types
// checked first). Between blocks it calls flush, which sends the loaded
// block. keepRaw stores the raw column; without it raw is empty.
func (e Events) Load(dst func() []column.Interface, keepRaw bool, maxRows int, flush func() error) error {
	cols := columnsPool.Get().(*block)
	defer func() {
		cols.reset()
		columnsPool.Put(cols)
	}()
	order := e.order
	for len(order) > 0 {
		chunk := order[:min(len(order), maxRows)]
		order = order[len(chunk):]
		cols.reset()
		for _, i := range chunk {
			if err := cols.appendRow(&e.rows[i], keepRaw); err != nil {
				return err
			}
		}
		if err := cols.load(dst()); err != nil {
			return err
		}
		if len(order) > 0 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return nil
}
