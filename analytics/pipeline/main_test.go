package pipeline

import (
	"os"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/testenv"
)

// eventList wraps events in an audit.k8s.io/v1 EventList.
func eventList(events ...string) string {
	return `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`
}

func TestMain(m *testing.M) {
	os.Exit(chdbtest.Run(m))
}

func testutilValue(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func chtestStart(tb testing.TB) *chtest.Server { return chtest.Start(tb) }

// newStore starts a ClickHouse server and returns a migrated store on it.
func newStore(t *testing.T, keepRaw bool) (*store.Store, *chtest.Server) {
	t.Helper()
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := chtest.Start(t)
	st, err := store.Open(t.Context(), store.Options{DSN: srv.DSN(), Database: srv.NewDatabase(t), KeepRaw: keepRaw})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st, srv
}

// distinctEventsSQL counts the events of {db}.events_by_hour once each.
// A WHERE may follow.
const distinctEventsSQL = "SELECT count() FROM (SELECT cluster FROM {db}.events_by_hour LIMIT 1 BY " + asql.Identity + ")"

// count runs a query of one UInt64 with {db} filled in.
func count(t *testing.T, st *store.Store, query string, args ...any) uint64 {
	t.Helper()
	var n uint64
	if err := st.Conn().QueryRow(t.Context(), strings.ReplaceAll(query, "{db}", st.Database()), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
