package record

import (
	"fmt"
	"strings"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

// historyTable is field_versions' column table, in the order of its DDL
// (analytics/store, migration "field_versions") and of the blocks
// LoadHistories builds: one row per write with a field history, what
// identifies the write, how it was based, and its fields.
var historyTable = [...]struct{ name, typ string }{
	{"event_date", "Date"},
	{"cluster", lcString},
	{"api_group", lcString},
	{"resource", lcString},
	{"namespace", lcString},
	{"name", "String"},
	{"object_version", "UInt64"},
	{"event_time_us", "UInt64"},
	{"request_received_us", "UInt64"},
	{"audit_id", "String"},
	{"stage", lcString},
	{"fingerprint", "UInt64"},
	{"verb", lcString},
	{"subresource", lcString},
	{"writer", lcString},
	{"field_manager", lcString},
	{"stamp", "String"},
	{"full_view", "UInt8"},
	{"request_managed", "UInt8"},
	{"force", "UInt8"},
	{"apply", "UInt8"},
	{"created", "UInt8"},
	{"field_paths", arrayString},
	{"field_hashes", arrayUInt64},
}

// The positions of historyTable's columns.
const (
	hDate = iota
	hCluster
	hAPIGroup
	hResource
	hNamespace
	hName
	hObjectVersion
	hTime
	hReceived
	hAuditID
	hStage
	hFingerprint
	hVerb
	hSubresource
	hWriter
	hFieldManager
	hStamp
	hFullView
	hRequestManaged
	hForce
	hApply
	hCreated
	hPaths
	hHashes
)

// HistoryColumns are field_versions' columns, in the order of the blocks
// LoadHistories builds: the column list of its INSERT.
var HistoryColumns = func() string {
	names := make([]string, len(historyTable))
	for i, c := range historyTable {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}()

// The positions of the strings a history row reads from its event's.
var (
	strVerb         = stringPos(colVerb)
	strSubresource  = stringPos(colSubresource)
	strFieldManager = stringPos(colFieldManager)
	strStamp        = stringPos(colStamp)
)

// historyBlock is a block of field_versions rows being built, encoded as
// the events' blocks are (nativeColumn): read from the records straight
// into the columns, without a row value in between.
type historyBlock struct {
	n       int
	cols    [len(historyTable)]nativeColumn
	scratch []byte
}

var historyPool = sync.Pool{New: func() any {
	b := &historyBlock{}
	for i, c := range historyTable {
		b.cols[i] = newNativeColumn(c.typ)
	}
	return b
}}

func (c *historyBlock) reset() {
	c.n = 0
	for i := range c.cols {
		c.cols[i].reset()
	}
}

// HistoryRows counts e's rows that have a field history.
func (e Events) HistoryRows() int {
	n := 0
	for _, i := range e.order {
		if e.rows[i].hist != 0 {
			n++
		}
	}
	return n
}

// LoadHistories builds the field_versions blocks of e's rows that have a
// field history, in the events' order, at most maxRows rows a block, and
// loads each into the columns of the driver's batch (the server's types
// checked first). Between blocks it calls flush, which sends the loaded
// block.
func (e Events) LoadHistories(dst func() []column.Interface, maxRows int, flush func() error) error {
	c := historyPool.Get().(*historyBlock)
	defer func() {
		c.reset()
		historyPool.Put(c)
	}()
	load := func() error {
		err := loadColumns("field history", c.cols[:], func(i int) string { return historyTable[i].typ }, c.n, &c.scratch, dst())
		c.reset()
		return err
	}
	for _, i := range e.order {
		r := &e.rows[i]
		if r.hist == 0 {
			continue
		}
		if c.n == maxRows {
			if err := load(); err != nil {
				return err
			}
			if err := flush(); err != nil {
				return err
			}
		}
		if err := c.appendRow(r); err != nil {
			return err
		}
	}
	if c.n == 0 {
		return nil
	}
	return load()
}

// appendRow reads the field history of row r, and what identifies and
// bases its write, from its record onto the columns.
func (c *historyBlock) appendRow(r *rowRef) error {
	d := recordReader{s: r.rec, i: r.off}
	var strs [rowStrings]string
	for k := range strs {
		strs[k] = d.str()
	}
	for range rowLists {
		for k := d.count(); k > 0; k-- {
			d.skipStr()
		}
	}
	t := d.tail()
	d.i = r.hist
	version := d.uvarint()
	flags := d.uvarint()
	fields := d.count()
	cols := &c.cols
	for range fields {
		cols[hPaths].str(d.str())
		cols[hHashes].putUint(d.uint64())
	}
	if d.err != nil {
		return fmt.Errorf("spool record field history: %w", d.err)
	}
	cols[hPaths].endArray(fields)
	cols[hHashes].endArray(fields)
	writer := strs[strImpersonated]
	if writer == "" {
		writer = strs[strUser]
	}
	cols[hDate].putUint(t.value(fillStageDay))
	cols[hCluster].putString(r.key.cluster)
	cols[hAPIGroup].putString(r.apiGroup)
	cols[hResource].putString(r.resource)
	cols[hNamespace].putString(r.namespace)
	cols[hName].putString(r.name)
	cols[hObjectVersion].putUint(version)
	cols[hTime].putUint(t.value(fillStageMicros))
	cols[hReceived].putUint(uint64(max(t.received, 0)))
	cols[hAuditID].putString(r.key.auditID)
	cols[hStage].putString(r.key.stage)
	cols[hFingerprint].putUint(r.key.fingerprint)
	cols[hVerb].putString(strs[strVerb])
	cols[hSubresource].putString(strs[strSubresource])
	cols[hWriter].putString(writer)
	cols[hFieldManager].putString(strs[strFieldManager])
	cols[hStamp].putString(strs[strStamp])
	cols[hFullView].putUint(boolBit(flags&histFullView != 0))
	cols[hRequestManaged].putUint(boolBit(flags&histRequestManaged != 0))
	cols[hForce].putUint(boolBit(flags&histForce != 0))
	cols[hApply].putUint(boolBit(flags&histApply != 0))
	cols[hCreated].putUint(boolBit(flags&histCreated != 0))
	c.n++
	return nil
}

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
