package report

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// TestSeriesReadMinuteCaches proves that the series of counts read from
// the minute caches equal the series read from events: the same panels
// (Grafana binder, expanded as the plugin does) over a window that cuts
// hours at seconds, before any compaction (events only) and after (whole
// minutes of the clean hours from minute_requests at 1m and 2m buckets,
// events alone at 30s). Then a row added to a clean hour's minute cache
// moves the 1m series by exactly that row and leaves the 30s one as it
// was: the cache branch is taken exactly when the buckets are whole
// minutes.
func TestSeriesReadMinuteCaches(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	conn := store.Conn()
	if err := Synthesize(ctx, conn, db, "bench", 60_000, 9, t0, 4*time.Hour); err != nil {
		t.Fatal(err)
	}
	g := asql.Grafana{Database: db,
		Variables: panelVariables,
		Values:    map[string]string{"min_bucket_writes": "3", "verb": "''", "code": "''", "hide_system": "'no'"}}
	series := []asql.Statement{asql.ConflictRateSeries, asql.ConflictKindsSeries, asql.StamplessGoneSeries}
	intervals := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute}
	// run is every series at every interval, by "name/interval".
	run := func() map[string][]string {
		out := map[string][]string{}
		for _, s := range series {
			bound, err := g.Bind(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, iv := range intervals {
				e := asql.Expansion{From: t0.Add(17*time.Minute + 3*time.Second), To: t0.Add(3*time.Hour + 41*time.Minute + 9*time.Second), Interval: iv,
					Vars: map[string][]string{"cluster": {"bench"}, "name": {""}}, All: map[string]bool{"namespace": true, "resource": true, "user": true}}
				sql, err := e.Expand(bound)
				if err != nil {
					t.Fatal(err)
				}
				_, rows := rowsOf(t, ctx, conn, sql)
				if len(rows) == 0 {
					t.Fatalf("%s at %v: no rows", s.Name, iv)
				}
				out[s.Name+"/"+iv.String()] = rows
			}
		}
		return out
	}
	raw := run()
	compact(t, store)
	cached := run()
	for k, want := range raw {
		if !slices.Equal(cached[k], want) {
			t.Errorf("%s: the series after compaction differs\nevents %d rows %.300v\ncaches %d rows %.300v", k, len(want), want, len(cached[k]), cached[k])
		}
	}

	// 7 version conflicts more in the minute 2:30 of the clean hour 2.
	hour := t0.Add(2 * time.Hour)
	minute := hour.Add(30 * time.Minute)
	hs, ms := strconv.FormatInt(hour.Unix(), 10), strconv.FormatInt(minute.Unix(), 10)
	if err := conn.Exec(ctx, `INSERT INTO `+db+`.minute_requests (event_date, hour, version, minute, cluster, api_group, resource, namespace, name, writer, version_conflicts)
		SELECT toDate(toDateTime(`+hs+`), 'UTC'), toDateTime(`+hs+`), argMax(version, (compacted_at, version)), toDateTime(`+ms+`), 'bench', '', 'configmaps', 'default', 'extra', 'tester', 7
		FROM `+db+`.hour_caches WHERE hour = toDateTime(`+hs+`)`); err != nil {
		t.Fatal(err)
	}
	tampered := run()
	for _, k := range []string{asql.ConflictKindsSeries.Name + "/30s", asql.StamplessGoneSeries.Name + "/1m0s"} {
		if !slices.Equal(tampered[k], raw[k]) {
			t.Errorf("%s: the row added to the minute cache changed it", k)
		}
	}
	// The 1m series' row of that minute, and no other, holds 7/60 more
	// version conflicts per second.
	k := asql.ConflictKindsSeries.Name + "/1m0s"
	var changed []string
	for _, r := range tampered[k] {
		if !slices.Contains(raw[k], r) {
			changed = append(changed, r)
		}
	}
	if len(changed) != 1 || len(tampered[k]) != len(raw[k]) {
		t.Fatalf("%s: the row added to the minute cache changed the rows %v (of %d, before %d): the series does not read the minute caches", k, changed, len(tampered[k]), len(raw[k]))
	}
	cells := strings.Split(changed[0], " | ")
	var before []string
	for _, r := range raw[k] {
		if c := strings.Split(r, " | "); c[0] == cells[0] {
			before = c
		}
	}
	if before == nil {
		t.Fatalf("%s: the changed row %s had no row before", k, changed[0])
	}
	was, err1 := strconv.ParseFloat(before[1], 64)
	is, err2 := strconv.ParseFloat(cells[1], 64)
	if err1 != nil || err2 != nil || math.Abs(is-was-7.0/60) > 1e-9 || !strings.HasPrefix(cells[0], minute.Format("2006-01-02 15:04:05")) {
		t.Errorf("%s: the row added to the minute cache made %v of %v, not 7/60 more version conflicts at %s", k, cells, before, minute)
	}
}
