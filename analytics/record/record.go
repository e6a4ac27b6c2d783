package record

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/stampguard/stampguard/analytics/audit"
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
// layout of layout.go.
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
// start of each row's fields (row must read them all, in the layout of
// layout.go) and dead with each dead letter. Set.Add takes every record
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
