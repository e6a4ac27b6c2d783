package report

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// TestPanelCachesAnswerAsEvents proves the panels' own caches and the
// newest-hours read of raw_events: conflicts by user agent (the agent
// caches), write latency (minute_write_latencies, exact weighted
// quantiles) and the newest events (the hours the counter caches say
// hold them) give the same rows before any compaction (events only) and
// after, with every filter at any, a writer, an object name and a code
// selected (the last two lie outside the panel caches, so those read
// events). raw_events also equals a plain query of the newest events.
// Then rows added to the caches move exactly the panels whose gate takes
// them, which shows each cache branch is read when, and only when, it
// should be.
func TestPanelCachesAnswerAsEvents(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	store, db := migrated(t)
	ctx := t.Context()
	conn := store.Conn()
	if err := Synthesize(ctx, conn, db, "bench", 60_000, 11, t0, 4*time.Hour); err != nil {
		t.Fatal(err)
	}
	var sparseWriter, hotName string
	if err := conn.QueryRow(ctx, "SELECT writer FROM "+db+".events_by_hour GROUP BY writer HAVING count() BETWEEN 150 AND 450 ORDER BY writer LIMIT 1").Scan(&sparseWriter); err != nil {
		t.Fatalf("a writer with a few hundred events: %v", err)
	}
	if err := conn.QueryRow(ctx, "SELECT name FROM "+db+".events_by_hour WHERE "+asql.VersionConflict+" GROUP BY name ORDER BY count() DESC, name LIMIT 1").Scan(&hotName); err != nil {
		t.Fatal(err)
	}
	from, to := t0.Add(17*time.Minute+3*time.Second), t0.Add(3*time.Hour+41*time.Minute+9*time.Second)
	type selection struct {
		name string
		code string
		vars map[string][]string
		all  map[string]bool
	}
	selections := []selection{
		{"any", "''", map[string][]string{"cluster": {"bench"}, "name": {""}}, map[string]bool{"namespace": true, "resource": true, "user": true}},
		{"writer", "''", map[string][]string{"cluster": {"bench"}, "user": {sparseWriter}, "name": {""}}, map[string]bool{"namespace": true, "resource": true}},
		{"name", "''", map[string][]string{"cluster": {"bench"}, "name": {hotName}}, map[string]bool{"namespace": true, "resource": true, "user": true}},
		{"code", "'409'", map[string][]string{"cluster": {"bench"}, "name": {""}}, map[string]bool{"namespace": true, "resource": true, "user": true}},
	}
	statements := []asql.Statement{asql.ConflictsByUserAgent, asql.WriteLatencySeries, asql.RawEvents}
	sqlOf := func(s asql.Statement, sel selection) string {
		g := asql.Grafana{Database: db, Variables: panelVariables,
			Values: map[string]string{"top": "1000", "verb": "''", "code": sel.code, "hide_system": "'no'"}}
		bound, err := g.Bind(s)
		if err != nil {
			t.Fatal(err)
		}
		sql, err := asql.Expansion{From: from, To: to, Interval: time.Minute, Vars: sel.vars, All: sel.all}.Expand(bound)
		if err != nil {
			t.Fatal(err)
		}
		return sql
	}
	// run is every statement under every selection, by "statement/selection".
	run := func() map[string][]string {
		out := map[string][]string{}
		for _, s := range statements {
			for _, sel := range selections {
				_, rows := rowsOf(t, ctx, conn, sqlOf(s, sel))
				if len(rows) == 0 {
					t.Fatalf("%s/%s: no rows", s.Name, sel.name)
				}
				out[s.Name+"/"+sel.name] = rows
			}
		}
		return out
	}
	raw := run()
	compact(t, store)
	cached := run()
	for k, want := range raw {
		if !slices.Equal(cached[k], want) {
			t.Errorf("%s: differs after compaction\nevents %d rows %.300v\ncaches %d rows %.300v", k, len(want), want, len(cached[k]), cached[k])
		}
	}
	// The newest events, written plainly: every event of the window, one
	// row per identity.
	for _, sel := range selections {
		cond := "1"
		switch sel.name {
		case "writer":
			cond = "writer = '" + sparseWriter + "'"
		case "name":
			cond = "name = '" + hotName + "'"
		case "code":
			cond = "code = 409"
		}
		_, want := rowsOf(t, ctx, conn, `SELECT event_time, writer, user_agent, verb, code, reason, message, stamp, field_manager, namespace, resource, name, audit_id
			FROM (SELECT * FROM `+db+`.events_by_hour WHERE stage IN ('ResponseComplete', 'Panic') AND dry_run = 0 AND cluster = 'bench' AND `+cond+`
				AND event_time >= toDateTime(`+strconv.FormatInt(from.Unix(), 10)+`) AND event_time <= toDateTime(`+strconv.FormatInt(to.Unix(), 10)+`)
				LIMIT 1 BY cluster, audit_id, stage, fingerprint)
			ORDER BY event_time_us DESC, audit_id LIMIT 500`)
		if got := cached[asql.RawEvents.Name+"/"+sel.name]; !slices.Equal(got, want) {
			t.Errorf("raw_events/%s: %d rows, the plain newest events %d", sel.name, len(got), len(want))
		}
	}
	if n := len(cached[asql.RawEvents.Name+"/writer"]); n == 0 || n >= 500 {
		t.Fatalf("the sparse writer has %d newest events: its list does not span the window's hours", n)
	}

	// Rows added to the caches of the clean hour 2 (minute 2:30).
	hour := t0.Add(2 * time.Hour)
	hs, ms := strconv.FormatInt(hour.Unix(), 10), strconv.FormatInt(hour.Add(30*time.Minute).Unix(), 10)
	version := `(SELECT argMax(version, (compacted_at, version)) FROM ` + db + `.hour_caches WHERE hour = toDateTime(` + hs + `))`
	for _, q := range []string{
		`INSERT INTO ` + db + `.hour_agent_requests (event_date, hour, version, cluster, api_group, resource, namespace, writer, user_agent, write_attempts, write_version_conflicts)
		SELECT toDate(toDateTime(` + hs + `), 'UTC'), toDateTime(` + hs + `), ` + version + `, 'bench', '', 'configmaps', 'default', 'tester', 'tampered/v1', 5, 3`,
		`INSERT INTO ` + db + `.minute_write_latencies (event_date, hour, version, minute, cluster, api_group, resource, namespace, writer, latency_us, writes)
		SELECT toDate(toDateTime(` + hs + `), 'UTC'), toDateTime(` + hs + `), ` + version + `, toDateTime(` + ms + `), 'bench', '', 'configmaps', 'default', 'tester', 7000000000, 1000000`,
		// The sparse writer's requests of hour 2 now number a million:
		// its newest events are read from hour 2 on.
		`INSERT INTO ` + db + `.hour_writer_requests (event_date, hour, version, cluster, api_group, resource, writer, requests)
		SELECT toDate(toDateTime(` + hs + `), 'UTC'), toDateTime(` + hs + `), ` + version + `, 'bench', '', 'configmaps', '` + sparseWriter + `', 1000000`,
	} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
	tampered := run()
	moved := map[string]bool{"conflicts_by_user_agent/any": true, "write_latency_series/any": true, "raw_events/writer": true}
	for k, want := range cached {
		if got := !slices.Equal(tampered[k], want); got != moved[k] {
			t.Errorf("%s: moved by the rows added to the caches %v, want %v", k, got, moved[k])
		}
	}
	if rows := tampered["conflicts_by_user_agent/any"]; !slices.ContainsFunc(rows, func(r string) bool { return strings.HasPrefix(r, "tampered/v1 | 5 | 3 |") }) {
		t.Errorf("conflicts by user agent does not show the agent cache's row: %.300v", rows)
	}
	if rows := tampered["write_latency_series/any"]; !slices.ContainsFunc(rows, func(r string) bool { return strings.Contains(r, "| configmaps | 7000 | 7000") }) {
		t.Errorf("write latency does not show the latency cache's row: %.500v", rows)
	}
	for _, r := range tampered["raw_events/writer"] {
		if r < hour.Format("2006-01-02 15:04:05") {
			t.Errorf("raw_events/writer lists %s, before the hour the counter caches say holds its newest events", r)
		}
	}
}
