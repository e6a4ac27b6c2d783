package record

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

// The insert side: the events column table, defined once, and the native
// ClickHouse blocks built straight from a Set's records.

// Column positions in columnTable, in the order of the events tables' DDL
// and of the insert.
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

// columnTable is the events tables' column table, the one definition of
// their columns: each column's name and ClickHouse type, and what fills
// it from a row. The store writes the column list of the events and
// events_by_hour DDL from it (Columns), the insert names its columns from
// it (EventColumns), and the blocks are built and checked against it
// (newBlock, block.appendRow, block.load), so the table and the insert
// cannot disagree.
//
// Entries are keyed by their col* constant, so each constant is bound to
// its column by name here rather than by counting; checkColumns refuses a
// table with a gap.
var columnTable = [...]eventColumn{
	colDate:             {"event_date", "Date", fillStageDay},
	colTime:             {"event_time", "DateTime", fillStageSecond},
	colTimeUS:           {"event_time_us", "UInt64", fillStageMicros},
	colReceivedUS:       {"request_received_us", "UInt64", fillReceivedMicros},
	colLatencyUS:        {"latency_us", "UInt64", fillLatency},
	colCluster:          {"cluster", lcString, fillCluster},
	colAuditID:          {"audit_id", "String", fillRecord},
	colStage:            {"stage", lcString, fillRecord},
	colFingerprint:      {"fingerprint", "UInt64", fillFingerprint},
	colLevel:            {"level", lcString, fillRecord},
	colVerb:             {"verb", lcString, fillRecord},
	colRequestURI:       {"request_uri", "String", fillRecord},
	colDryRun:           {"dry_run", "UInt8", fillDryRun},
	colUser:             {"user", lcString, fillRecord},
	colUserGroups:       {"user_groups", arrayString, fillRecord},
	colImpersonatedUser: {"impersonated_user", lcString, fillRecord},
	colWriter:           {"writer", lcString, fillWriter},
	colUserAgent:        {"user_agent", lcString, fillRecord},
	colSourceIP:         {"source_ip", "String", fillRecord},
	colAPIGroup:         {"api_group", lcString, fillRecord},
	colAPIVersion:       {"api_version", lcString, fillRecord},
	colResource:         {"resource", lcString, fillRecord},
	colSubresource:      {"subresource", lcString, fillRecord},
	colNamespace:        {"namespace", lcString, fillRecord},
	colName:             {"name", "String", fillRecord},
	colObjectUID:        {"object_uid", "String", fillRecord},
	colStamp:            {"stamp", "String", fillRecord},
	colFieldManager:     {"field_manager", lcString, fillRecord},
	colCode:             {"code", "UInt16", fillCode},
	colReason:           {"reason", lcString, fillRecord},
	colMessage:          {"message", "String", fillRecord},
	colCauseReasons:     {"cause_reasons", arrayString, fillRecord},
	colCauseFields:      {"cause_fields", arrayString, fillRecord},
	colAuthzDecision:    {"authz_decision", lcString, fillRecord},
	colAnnotationKeys:   {"annotation_keys", arrayString, fillRecord},
	colAnnotationValues: {"annotation_values", arrayString, fillRecord},
	colLeaseHolder:      {"lease_holder", "String", fillRecord},
	colRaw:              {"raw", "String", fillRecord}, // empty unless the store keeps raw
}

// eventColumn is one column of columnTable.
type eventColumn struct {
	name, typ string
	fill      fill
}

// The types of string columns besides String. With String and the types
// of fixedWidths they are all the encoder writes; checkColumns refuses
// any other.
const (
	lcString    = "LowCardinality(String)"
	arrayString = "Array(String)"
	arrayUInt64 = "Array(UInt64)"
)

// fixedWidths are the fixed-width types the encoder writes, each with the
// bytes of one value (little endian, as the Native format has them).
var fixedWidths = map[string]int{"Date": 2, "DateTime": 4, "UInt8": 1, "UInt16": 2, "UInt64": 8}

// A fill says what fills a column from a row. Its type alone decides how
// a value is encoded (nativeColumn.putString, putUint), so a fill only
// names the value; fillTypes says which type holds each computed one.
type fill uint8

const (
	// fillRecord is a string or list of the row's record: the row layout
	// (rowStringFields, rowListFields, layout.go) says which.
	fillRecord         fill = iota
	fillCluster             // the record's cluster
	fillWriter              // the impersonated user, else the user (audit.Row.Writer)
	fillStageDay            // the stage time's day (UTC), days since 1970
	fillStageSecond         // the stage time, Unix seconds
	fillStageMicros         // the stage time, Unix microseconds
	fillReceivedMicros      // the request's receipt, Unix microseconds (0: unknown)
	fillLatency             // stage minus receipt, 0 when the receipt is unknown or later
	fillFingerprint         // the row's Fingerprint
	fillDryRun              // 1 for a dry run, else 0
	fillCode                // the response code
)

// fillTypes are the types that hold the value of each fill other than
// fillRecord, whose types the row layout's fields decide.
var fillTypes = map[fill][]string{
	fillCluster:        {"String", lcString},
	fillWriter:         {"String", lcString},
	fillStageDay:       {"Date"},
	fillStageSecond:    {"DateTime"},
	fillStageMicros:    {"UInt64"},
	fillReceivedMicros: {"UInt64"},
	fillLatency:        {"UInt64"},
	fillFingerprint:    {"UInt64"},
	fillDryRun:         {"UInt8"},
	fillCode:           {"UInt16"},
}

// A Column is one column of the events tables, as their DDL declares it.
type Column struct {
	Name string
	Type string // as ClickHouse spells it, e.g. LowCardinality(String)
}

// Columns are the columns of the events tables (events, events_by_hour),
// in the order of their DDL and of the insert's blocks: the store writes
// the tables' column list from them, so the tables and the insert cannot
// disagree. The slice is the caller's.
func Columns() []Column {
	cols := make([]Column, len(columnTable))
	for i, c := range columnTable {
		cols[i] = Column{Name: c.name, Type: c.typ}
	}
	return cols
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

// computedColumns are the columns whose fill is not fillRecord, which
// block.appendRow fills after the record's fields.
var computedColumns = func() (cc []computedColumn) {
	for i, c := range columnTable {
		if c.fill != fillRecord {
			cc = append(cc, computedColumn{col: i, fill: c.fill})
		}
	}
	return cc
}()

// computedColumn is a column of columnTable and its fill.
type computedColumn struct {
	col  int
	fill fill
}

// The positions of the strings block.appendRow reads by name.
var (
	strUser         = stringPos(colUser)
	strImpersonated = stringPos(colImpersonatedUser)
	strRaw          = stringPos(colRaw)
)

// checkColumns checks the column table against itself and the row layout:
// every column has a name of its own and a type the encoder writes, each
// computed value goes to a type that holds it, and every column filled
// from the record takes exactly one field of the row layout, a string to
// a String or LowCardinality(String) column and a list to an
// Array(String) one. A table that fails would build blocks the server misreads, so the
// package refuses to start with it (init).
func checkColumns() error {
	names := map[string]bool{}
	for i, c := range columnTable {
		if c.name == "" || names[c.name] {
			return fmt.Errorf("record: column %d is named %q, want a name of its own", i, c.name)
		}
		names[c.name] = true
		if _, fixed := fixedWidths[c.typ]; !fixed && c.typ != "String" && c.typ != lcString && c.typ != arrayString {
			return fmt.Errorf("record: column %s is a %s, which the encoder does not write", c.name, c.typ)
		}
		if c.fill != fillRecord && !slices.Contains(fillTypes[c.fill], c.typ) {
			return fmt.Errorf("record: column %s is a %s, which cannot hold its value (want one of %q)", c.name, c.typ, fillTypes[c.fill])
		}
	}
	fields := make([]int, len(columnTable)) // layout fields per column
	check := func(layout []rowField, kind string, types ...string) error {
		for _, f := range layout {
			c := columnTable[f.col]
			switch {
			case c.fill != fillRecord:
				return fmt.Errorf("record: the row layout fills column %s, which the column table fills otherwise", c.name)
			case !slices.Contains(types, c.typ):
				return fmt.Errorf("record: the row layout puts a %s into column %s, a %s (want one of %q)", kind, c.name, c.typ, types)
			}
			fields[f.col]++
		}
		return nil
	}
	if err := check(rowStringFields[:], "string", "String", lcString); err != nil {
		return err
	}
	if err := check(rowListFields[:], "list", arrayString); err != nil {
		return err
	}
	for i, c := range columnTable {
		if c.fill == fillRecord && fields[i] != 1 {
			return fmt.Errorf("record: column %s takes %d fields of the row layout, want 1", c.name, fields[i])
		}
	}
	return nil
}

func init() {
	if err := checkColumns(); err != nil {
		panic(err)
	}
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

var columnsPool = sync.Pool{New: func() any { return newBlock() }}

func newBlock() *block {
	b := &block{}
	for i, c := range columnTable {
		b.cols[i] = newNativeColumn(c.typ)
	}
	return b
}

// newNativeColumn is an empty column of type typ: one of the types the
// encoder writes (lcString, arrayString, arrayUInt64, String, fixedWidths).
func newNativeColumn(typ string) nativeColumn {
	switch typ {
	case lcString:
		return nativeColumn{dict: map[string]uint32{}}
	case arrayString:
		return nativeColumn{array: true}
	case arrayUInt64:
		return nativeColumn{array: true, width: 8}
	case "String":
		return nativeColumn{plain: true}
	}
	return nativeColumn{width: fixedWidths[typ]}
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
	width int // of a fixed-width value, in bytes; 0 for the other types
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

// putString appends a row's value to a String or LowCardinality(String)
// column, in the encoding of its type.
func (c *nativeColumn) putString(s string) {
	if c.dict != nil {
		c.lc(s)
		return
	}
	c.str(s)
}

// putUint appends a row's value to a fixed-width column: its low width
// bytes, little endian, which is the conversion to the column's type (a
// Date or DateTime out of range wraps, as it did through the driver).
func (c *nativeColumn) putUint(v uint64) {
	switch c.width {
	case 1:
		c.data = append(c.data, uint8(v))
	case 2:
		c.data = binary.LittleEndian.AppendUint16(c.data, uint16(v))
	case 4:
		c.data = binary.LittleEndian.AppendUint32(c.data, uint32(v))
	default:
		c.data = binary.LittleEndian.AppendUint64(c.data, v)
	}
}

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
	if !keepRaw {
		strs[strRaw] = ""
	}
	for i, f := range &rowStringFields {
		cols[f.col].putString(strs[i])
	}
	for _, cc := range computedColumns {
		col := &cols[cc.col]
		switch cc.fill {
		case fillCluster:
			col.putString(r.key.cluster)
		case fillWriter:
			writer := strs[strImpersonated]
			if writer == "" {
				writer = strs[strUser]
			}
			col.putString(writer)
		default:
			col.putUint(t.value(cc.fill))
		}
	}
	c.n++
	return nil
}

// value is the computed value of fill (not fillRecord, fillCluster or
// fillWriter) for the row whose tail t is.
func (t *rowTail) value(f fill) uint64 {
	switch f {
	case fillStageDay:
		return uint64(floorDiv(floorDiv(t.stage, 1e6), 86400))
	case fillStageSecond:
		return uint64(floorDiv(t.stage, 1e6))
	case fillStageMicros:
		return uint64(t.stage)
	case fillReceivedMicros:
		return uint64(t.received)
	case fillLatency:
		if t.received != 0 && t.stage >= t.received {
			return uint64(t.stage - t.received)
		}
		return 0
	case fillFingerprint:
		return t.fingerprint
	case fillDryRun:
		return t.flags & 1
	case fillCode:
		return uint64(t.code)
	}
	panic(fmt.Sprintf("record: fill %d is no computed value", f))
}

// floorDiv is a/b rounded down, so that a time before 1970 falls in the
// second and day it is in.
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
	return loadColumns("events", c.cols[:], func(i int) string { return columnTable[i].typ }, c.n, &c.scratch, dst)
}

// loadColumns decodes cols, of n rows, into the driver's batch columns
// dst, after checking that the server asked for the types built (typ of
// each column); what names the insert in errors.
func loadColumns(what string, cols []nativeColumn, typ func(i int) string, n int, scratch *[]byte, dst []column.Interface) error {
	if len(dst) != len(cols) {
		return fmt.Errorf("%s insert: the server asked for %d columns, want %d", what, len(dst), len(cols))
	}
	for i, col := range dst {
		if got := string(col.Type()); got != typ(i) {
			return fmt.Errorf("%s insert: column %s is %s, want %s", what, col.Name(), got, typ(i))
		}
		if sc, ok := col.(*column.String); ok && cols[i].plain {
			if _, err := sc.Append(cols[i].strs); err != nil {
				return fmt.Errorf("%s insert: load column %s: %w", what, col.Name(), err)
			}
			continue
		}
		if err := col.Decode(proto.NewReader(cols[i].reader(n, scratch)), n); err != nil {
			return fmt.Errorf("%s insert: load column %s: %w", what, col.Name(), err)
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
