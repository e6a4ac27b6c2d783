package record

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

// The insert side: the events column table, defined once, and the native
// ClickHouse blocks built straight from a Set's records.

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

// The positions of the strings block.appendRow reads by name.
var (
	strUser         = stringPos(colUser)
	strImpersonated = stringPos(colImpersonatedUser)
)

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
