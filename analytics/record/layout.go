package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/stampguard/stampguard/internal/audit"
)

// recordVersion is the first byte of every record; the reader refuses
// versions it does not know rather than misreading them. Version 2 added
// the history entry (tagHistory); a version 1 record, left in a spool by
// an earlier release, reads as one without histories.
const recordVersion = 2

var errShortRecord = errors.New("spool record truncated")

// A record is the version byte, the cluster, then entries until its end:
// a tag byte (tagRow, tagDead or tagHistory) and the entry. Entries are
// appended one at a time, so a row can be encoded while its strings still
// point into the reader's buffer. A history entry follows the row whose
// field history it is (AppendRow writes both).
const (
	tagRow     = 1
	tagDead    = 2
	tagHistory = 3
)

// A history entry: the object version (uvarint), the flags (uvarint: bit
// 0 FullView, bit 1 RequestManaged, bit 2 Force, bit 3 Apply, bit 4
// Created), the number of fields,
// then each field's path (a string) and hash (8 bytes, little endian).
const (
	histFullView = 1 << iota
	histRequestManaged
	histForce
	histApply
	histCreated
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
	dst = tailOf(r).appendTo(dst)
	if r.ObjectVersion == 0 {
		return dst // no history: versions that cannot be ordered
	}
	var flags uint64
	if r.FullView {
		flags |= histFullView
	}
	if r.RequestManaged {
		flags |= histRequestManaged
	}
	if r.Force {
		flags |= histForce
	}
	if r.Apply {
		flags |= histApply
	}
	if r.Created {
		flags |= histCreated
	}
	dst = append(dst, tagHistory)
	dst = binary.AppendUvarint(dst, r.ObjectVersion)
	dst = binary.AppendUvarint(dst, flags)
	dst = binary.AppendUvarint(dst, uint64(len(r.Fields.Paths)))
	for i, p := range r.Fields.Paths {
		dst = appendString(dst, p)
		dst = binary.LittleEndian.AppendUint64(dst, r.Fields.Hashes[i])
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// readRecord is the one parser of a record's entries: it checks the
// version and reads the cluster, then calls row with the reader at the
// start of each row's fields (row must read them all, in the row
// layout), history with the reader at the start of each history entry
// (history must read it all, with readHistory), and dead with each dead
// letter. Set.Add takes every record through it; the columns read a row's
// fields again from where Set.Add saw them start.
func readRecord(rec string, row func(cluster string, d *recordReader), history func(d *recordReader), dead func(audit.DeadLetter)) error {
	d := recordReader{s: rec}
	if v := d.byte(); v != recordVersion && v != 1 {
		return fmt.Errorf("spool record version %d, want 1 or %d", v, recordVersion)
	}
	cluster := d.str()
	for d.err == nil && d.i < len(d.s) {
		switch tag := d.byte(); tag {
		case tagRow:
			row(cluster, &d)
		case tagHistory:
			history(&d)
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

// History is the field history of one row, as its history entry holds
// it; Paths and Hashes are the entry's own (readHistory allocates them).
type History struct {
	ObjectVersion                                   uint64
	FullView, RequestManaged, Force, Apply, Created bool
	Paths                                           []string
	Hashes                                          []uint64
}

// readHistory reads a history entry; with fields false it skips the
// fields, and h holds only the version and flags.
func (d *recordReader) readHistory(h *History, fields bool) {
	h.ObjectVersion = d.uvarint()
	flags := d.uvarint()
	h.FullView, h.RequestManaged, h.Force, h.Apply = flags&histFullView != 0, flags&histRequestManaged != 0, flags&histForce != 0, flags&histApply != 0
	h.Created = flags&histCreated != 0
	n := d.count()
	if fields {
		h.Paths, h.Hashes = make([]string, 0, n), make([]uint64, 0, n)
	}
	for range n {
		if !fields {
			d.skipStr()
			if d.i+8 > len(d.s) {
				d.fail()
				return
			}
			d.i += 8
			continue
		}
		h.Paths = append(h.Paths, d.str())
		h.Hashes = append(h.Hashes, d.uint64())
	}
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
// field is one row here (and its column in columnTable, columns.go, with
// fillRecord). The layout is the spool's format on disk, which a
// restarted sink reads back, so a change to it needs a new recordVersion.
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

// stringPos is the position of column col's string in a row's record.
func stringPos(col int) int {
	for i, f := range rowStringFields {
		if f.col == col {
			return i
		}
	}
	panic(fmt.Sprintf("record: column %d is no string of a row's record", col))
}
