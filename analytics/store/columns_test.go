package store

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"

	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// wantColumns is what the events row of r holds, column by column in
// EventColumns order, as Go values the driver scans.
func wantColumns(r *audit.Row, keepRaw bool) []any {
	t := time.UnixMicro(r.StageMicros).UTC()
	// The latency column: stage - received, 0 when unknown or negative.
	var latency int64
	if r.RequestReceivedMicros != 0 && r.StageMicros >= r.RequestReceivedMicros {
		latency = r.StageMicros - r.RequestReceivedMicros
	}
	raw := ""
	if keepRaw {
		raw = r.Raw
	}
	dry := uint8(0)
	if r.DryRun {
		dry = 1
	}
	l := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return []any{
		time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC), t.Truncate(time.Second),
		uint64(r.StageMicros), uint64(r.RequestReceivedMicros), uint64(latency),
		r.Cluster, r.AuditID, r.Stage, r.Fingerprint, r.Level, r.Verb, r.RequestURI, dry,
		r.User, l(r.UserGroups), r.ImpersonatedUser, r.Writer(), r.UserAgent, r.SourceIP,
		r.APIGroup, r.APIVersion, r.Resource, r.Subresource, r.Namespace, r.Name, r.ObjectUID,
		r.Stamp, r.FieldManager, uint16(r.Code), r.Reason, r.Message, l(r.CauseReasons), l(r.CauseFields),
		r.AuthzDecision, l(r.AnnotationKeys), l(r.AnnotationValues), r.LeaseHolder, raw,
	}
}

// columnTestRows are the real events plus rows that reach the encoder's
// edges: empty and non-ASCII strings, empty and long lists, dry runs,
// impersonation, times before 1970 and after 2038, and enough distinct
// values that LowCardinality keys need 16 bits.
func columnTestRows(t testing.TB, distinct int) []audit.Row {
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	base := rows[0]
	for i := range distinct {
		r := base
		r.Cluster = []string{"prod", "dev", ""}[i%3]
		r.AuditID = fmt.Sprintf("edge-%06d", i)
		r.Namespace = fmt.Sprintf("ns-%d", i)
		r.UserAgent = strings.Repeat("ü", i%5)
		r.ImpersonatedUser = []string{"", "bob"}[i%2]
		r.DryRun = i%4 == 0
		r.UserGroups = []string{"a", "", "ж"}[:i%4%3]
		r.CauseReasons = nil
		r.AnnotationKeys = make([]string, i%7)
		r.Code = int32(i % 600)
		r.Message = strings.Repeat("m", i%300)
		switch i % 5 {
		case 1:
			r.StageMicros = -86_400_000_000*3 - 1
			r.RequestReceivedMicros = r.StageMicros + 5 // latency 0: received after the stage
		case 2:
			r.StageMicros = 2_200_000_000_000_000
		case 3:
			r.RequestReceivedMicros = 0
		}
		r.Fingerprint = audit.Fingerprint(&r)
		rows = append(rows, r)
	}
	return rows
}

// Positions of the columns the tests read by name.
var (
	colCluster = col("cluster")
	colAuditID = col("audit_id")
	colDate    = col("event_date")
	colTime    = col("event_time")
)

// eventColumnNames are the events insert's columns, in order.
var eventColumnNames = strings.Split(record.EventColumns, ", ")

// col is the position of the events column name.
func col(name string) int {
	i := slices.Index(eventColumnNames, name)
	if i < 0 {
		panic("no events column " + name)
	}
	return i
}

// eventsDDLTypes are the column types of the events tables' DDL
// (eventsColumnsDDL), by name.
func eventsDDLTypes(t *testing.T) map[string]string {
	types := map[string]string{}
	for _, l := range strings.Split(strings.Trim(strings.TrimSpace(eventsColumnsDDL), "()"), "\n") {
		if f := strings.Fields(strings.TrimSuffix(strings.TrimSpace(l), ",")); len(f) == 2 {
			types[f[0]] = f[1]
		}
	}
	if len(types) != len(eventColumnNames) {
		t.Fatalf("the events DDL has %d columns, the insert %d", len(types), len(eventColumnNames))
	}
	return types
}

// loadColumns builds the events columns of rows the way insertEvents does,
// in one block, and loads them into fresh driver columns of the events
// types (which the columns check).
func loadColumns(t *testing.T, rows []audit.Row, keepRaw bool) []column.Interface {
	t.Helper()
	set := recordtest.Set(rows, nil)
	types := eventsDDLTypes(t)
	dst := make([]column.Interface, len(eventColumnNames))
	for i, name := range eventColumnNames {
		var err error
		if dst[i], err = column.Type(types[name]).Column(name, &column.ServerContext{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := set.Events().Load(func() []column.Interface { return dst }, keepRaw, len(rows), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestNativeColumnsHoldEveryRowAsTheDriverReadsIt(t *testing.T) {
	for _, tt := range []struct {
		name     string
		distinct int
		keepRaw  bool
	}{
		{"real events, raw kept", 0, true},
		{"edge rows with 16-bit LowCardinality keys, raw dropped", 700, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rows := columnTestRows(t, tt.distinct)
			byKey := map[string]*audit.Row{}
			for i := range rows {
				byKey[rows[i].Cluster+"/"+rows[i].AuditID] = &rows[i]
			}
			dst := loadColumns(t, rows, tt.keepRaw)
			// Encode as the driver sends them and decode again, so that
			// what the driver writes from loaded columns is checked too.
			for i, c := range dst {
				var buf proto.Buffer
				if s, ok := c.(column.CustomSerialization); ok {
					_ = s.WriteStatePrefix(&buf)
				}
				c.Encode(&buf)
				fresh, err := c.Type().Column(c.Name(), &column.ServerContext{})
				if err != nil {
					t.Fatal(err)
				}
				r := proto.NewReader(buf.Reader())
				if s, ok := fresh.(column.CustomSerialization); ok {
					if err := s.ReadStatePrefix(r); err != nil {
						t.Fatal(err)
					}
				}
				if err := fresh.Decode(r, len(rows)); err != nil {
					t.Fatalf("column %s: %v", c.Name(), err)
				}
				dst[i] = fresh
			}
			for i := range rows {
				// The block is in the table's order; find each row by key.
				r := byKey[dst[colCluster].Row(i, false).(string)+"/"+dst[colAuditID].Row(i, false).(string)]
				want := wantColumns(r, tt.keepRaw)
				if wraps(r) {
					want[colDate], want[colTime] = dst[colDate].Row(i, false).(time.Time).UTC(), dst[colTime].Row(i, false).(time.Time).UTC()
				}
				for j, c := range dst {
					got := c.Row(i, false)
					if tm, ok := got.(time.Time); ok {
						got = tm.UTC()
					}
					if !reflect.DeepEqual(got, want[j]) {
						t.Fatalf("row %d (%s) column %s: got %#v, want %#v", i, r.AuditID, c.Name(), got, want[j])
					}
				}
			}
		})
	}
}

// wraps reports whether r's stage time is outside what Date and DateTime
// hold: those wrap around, as they did through the driver's own append.
func wraps(r *audit.Row) bool { return r.StageMicros < 0 || r.StageMicros >= 1<<32*1e6 }

func TestInsertedColumnsReadBackExactly(t *testing.T) {
	st, _ := newStore(t, true)
	rows := columnTestRows(t, 400)
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	res, err := st.conn.Query(t.Context(), "SELECT "+record.EventColumns+" FROM "+st.db+".events_by_hour")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	byKey := map[string]*audit.Row{}
	for i := range rows {
		byKey[rows[i].Cluster+"/"+rows[i].AuditID] = &rows[i]
	}
	n := 0
	for res.Next() {
		want := wantColumns(&rows[0], true)
		dst := make([]any, len(want))
		for i, w := range want {
			dst[i] = reflect.New(reflect.TypeOf(w)).Interface()
		}
		if err := res.Scan(dst...); err != nil {
			t.Fatal(err)
		}
		got := make([]any, len(dst))
		for i, d := range dst {
			got[i] = reflect.ValueOf(d).Elem().Interface()
			if tm, ok := got[i].(time.Time); ok {
				got[i] = tm.UTC()
			}
		}
		r := byKey[got[colCluster].(string)+"/"+got[colAuditID].(string)]
		if r == nil {
			t.Fatalf("unexpected row %v", got[:8])
		}
		want = wantColumns(r, true)
		if wraps(r) {
			got[colDate], got[colTime], want[colDate], want[colTime] = nil, nil, nil, nil
		}
		for i := range want {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Errorf("%s column %d: got %#v, want %#v", r.AuditID, i, got[i], want[i])
			}
		}
		n++
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(rows) {
		t.Errorf("%d rows read back, want %d", n, len(rows))
	}
}

func TestInsertSendsEventsInTheTablesOrder(t *testing.T) {
	st, _ := newStore(t, false)
	rows := columnTestRows(t, 3000)
	for i := range rows { // a shuffled order, as batches from many apiservers arrive
		j := (i * 7919) % len(rows)
		rows[i], rows[j] = rows[j], rows[i]
	}
	event := func(name string) uint64 {
		return count(t, st, "SELECT toUInt64(sum(value)) FROM system.events WHERE event = ?", name)
	}
	sorted0 := event("MergeTreeDataWriterBlocksAlreadySorted")
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	// The events block (one per day partition the rows span) arrives sorted;
	// event_keys and the rollup have orders of their own.
	parts := count(t, st, "SELECT count() FROM system.parts WHERE database = ? AND table = 'events' AND active", st.db)
	if got := event("MergeTreeDataWriterBlocksAlreadySorted") - sorted0; got < parts {
		t.Errorf("%d blocks arrived sorted, want at least the %d events parts", got, parts)
	}
}
