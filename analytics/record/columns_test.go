package record

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

func TestNativeColumnsUse32BitKeysForHugeDictionaries(t *testing.T) {
	c := newBlock()
	col := &c.cols[colUserAgent]
	const n = 70_000
	for i := range n {
		col.lc(fmt.Sprint(i % (n - 1)))
	}
	dst, err := column.Type(lcString).Column("user_agent", &column.ServerContext{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Decode(proto.NewReader(col.reader(n, &c.scratch)), n); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 255, 256, 65535, 65536, n - 2, n - 1} {
		if got, want := dst.Row(i, false), fmt.Sprint(i%(n-1)); got != want {
			t.Errorf("row %d: %v, want %s", i, got, want)
		}
	}
}

// benchBlockRows is the store's block size (store.insertBlockRows).
const benchBlockRows = 8 << 10

// BenchmarkEventColumns builds the events blocks of a 40,960-row insert
// from spool records (five blocks of 8,192 rows), loads each into the
// driver's columns and encodes it as the driver sends it: the sink's CPU
// per event between the spool and the socket.
func BenchmarkEventColumns(b *testing.B) {
	tmpl := audittest.Rows(b, "bench", audittest.Events(b)[:9])
	rows := make([]audit.Row, 5*benchBlockRows)
	for i := range rows {
		rows[i] = tmpl[i%len(tmpl)]
		rows[i].AuditID = fmt.Sprintf("bench-%d", i)
		rows[i].Raw = ""
	}
	set := setOf(b, rows, nil)
	cols := newBlock()
	var buf proto.Buffer
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		// A new batch per insert, as PrepareBatch makes one.
		dst := make([]column.Interface, len(columnTable))
		for i, c := range columnTable {
			var err error
			if dst[i], err = column.Type(c.typ).Column(c.name, &column.ServerContext{}); err != nil {
				b.Fatal(err)
			}
		}
		for chunk := range slices.Chunk(set.rows, benchBlockRows) {
			cols.reset()
			for i := range chunk {
				if err := cols.appendRow(&chunk[i], false); err != nil {
					b.Fatal(err)
				}
			}
			if err := cols.load(dst); err != nil {
				b.Fatal(err)
			}
			buf.Reset()
			for _, c := range dst {
				if s, ok := c.(column.CustomSerialization); ok {
					_ = s.WriteStatePrefix(&buf)
				}
				c.Encode(&buf)
				c.Reset() // as batch.Flush does
			}
		}
	}
	b.ReportMetric((processCPU()-cpu0).Seconds()*1e6/float64(b.N*len(rows)), "cpu-µs/event")
}

// processCPU is the CPU time of this process (all threads, so GC counts),
// which other jobs on a shared machine disturb less than wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestStringColumnsLoadAsTheirNativeEncodingDecodes(t *testing.T) {
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	rows[0].Message = "tab\there, quote\" and ünïcode"
	rows[1].Raw = ""
	set := setOf(t, rows, nil)
	c := newBlock()
	for i := range set.rows {
		if err := c.appendRow(&set.rows[i], true); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]column.Interface, len(columnTable))
	for i, ct := range columnTable {
		var err error
		if dst[i], err = column.Type(ct.typ).Column(ct.name, &column.ServerContext{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.load(dst); err != nil {
		t.Fatal(err)
	}
	plain := 0
	for i, ct := range columnTable {
		if ct.typ != "String" {
			continue
		}
		plain++
		// The encoding the driver's Decode reads, which load used before
		// it appended String columns.
		want, err := column.Type(ct.typ).Column(ct.name, &column.ServerContext{})
		if err != nil {
			t.Fatal(err)
		}
		if err := want.Decode(proto.NewReader(c.cols[i].reader(c.n, &c.scratch)), c.n); err != nil {
			t.Fatal(err)
		}
		if dst[i].Rows() != len(rows) || want.Rows() != len(rows) {
			t.Fatalf("%s: %d and %d rows, want %d", ct.name, dst[i].Rows(), want.Rows(), len(rows))
		}
		for r := range len(rows) {
			if got, want := dst[i].Row(r, false), want.Row(r, false); got != want {
				t.Errorf("%s row %d: %q, want %q", ct.name, r, got, want)
			}
		}
	}
	if got := dst[colMessage].Row(0, false); got != rows[0].Message {
		t.Errorf("message %q, want %q", got, rows[0].Message)
	}
	if plain < 5 {
		t.Fatalf("only %d String columns", plain)
	}
}
