package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/pkitest"

	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/testenv"
)

// newStore starts (once per test binary) a ClickHouse server and returns a
// migrated store on a fresh database.
func newStore(t *testing.T, keepRaw bool) (*Store, *chtest.Server) {
	t.Helper()
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := sharedServer(t)
	db := srv.NewDatabase(t)
	st, err := Open(t.Context(), Options{DSN: srv.DSN(), Database: db, KeepRaw: keepRaw})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st, srv
}

var shared struct {
	srv *chtest.Server
}

// sharedServer starts one server for the package's tests; each test gets
// its own database. The server lives until the test binary exits.
func sharedServer(t *testing.T) *chtest.Server {
	if shared.srv == nil {
		shared.srv = chtest.Start(&processTB{TB: t})
	}
	return shared.srv
}

// distinctEventsSQL counts the events of {db}.events_by_hour once each.
// A WHERE may follow.
const distinctEventsSQL = "SELECT count() FROM (SELECT cluster FROM {db}.events_by_hour LIMIT 1 BY " + asql.Identity + ")"

func count(t *testing.T, st *Store, query string, args ...any) uint64 {
	t.Helper()
	var n uint64
	if err := st.conn.QueryRow(t.Context(), strings.ReplaceAll(query, "{db}", st.db), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func TestMigrateIsIdempotent(t *testing.T) {
	st, _ := newStore(t, false)
	applied, err := st.Migrate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Errorf("second migrate applied %v", applied)
	}
	v, err := st.SchemaVersion(t.Context())
	if err != nil || v != Migrations[len(Migrations)-1].Version {
		t.Errorf("schema version %d (%v)", v, err)
	}
	if n := count(t, st, "SELECT count() FROM {db}.schema_migrations"); n != uint64(len(Migrations)) {
		t.Errorf("%d migration rows, want %d", n, len(Migrations))
	}
}

func TestInsertSendsEachEventOfABatchOnce(t *testing.T) {
	st, _ := newStore(t, true)
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	ctx := t.Context()

	res, err := st.InsertRecords(ctx, recordtest.Set(rows, nil))
	if err != nil {
		t.Fatal(err)
	}
	if res.Stored != len(rows) || res.Duplicates != 0 {
		t.Fatalf("first insert %+v, want %d stored", res, len(rows))
	}
	tests := []struct {
		name        string
		rows        []audit.Row
		wantStored  int
		wantDropped int
		newEvents   int
	}{
		{"a redelivered batch is stored again, as copies", rows, len(rows), 0, 0},
		{"a batch repeating an event within itself sends it once", append(audittest.Rows(t, "staging", audittest.Events(t)[:2]), audittest.Rows(t, "staging", audittest.Events(t)[:2])...), 2, 2, 2},
		{"the same events from another cluster are new", audittest.Rows(t, "dev", audittest.Events(t)[:3]), 3, 0, 3},
		{"a reused audit ID of a different request is a new event", func() []audit.Row {
			r := audittest.Rows(t, "prod", audittest.Events(t)[:1])
			r[0].StageMicros++
			r[0].Fingerprint = audit.Fingerprint(&r[0])
			return r
		}(), 1, 0, 1},
	}
	events := len(rows)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := st.InsertRecords(ctx, recordtest.Set(tt.rows, nil))
			if err != nil {
				t.Fatal(err)
			}
			if res.Stored != tt.wantStored || res.Duplicates != tt.wantDropped {
				t.Errorf("%+v, want %d stored and %d dropped", res, tt.wantStored, tt.wantDropped)
			}
			events += tt.newEvents
			if n := count(t, st, distinctEventsSQL); n != uint64(events) {
				t.Errorf("events holds %d distinct events, want %d", n, events)
			}
		})
	}
}

func TestInsertedRowsReadBack(t *testing.T) {
	st, _ := newStore(t, true)
	rows := audittest.Rows(t, "prod", audittest.Events(t))
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	var (
		writer, holder, stamp, fm string
		code                      uint16
		causes                    []string
		us                        uint64
		evTime                    time.Time
		raw                       string
	)
	q := func(auditID string, dst ...any) {
		t.Helper()
		if err := st.conn.QueryRow(t.Context(), `SELECT writer, lease_holder, stamp, field_manager, code,
			cause_reasons, event_time_us, event_time, raw FROM `+st.db+`.events_by_hour WHERE audit_id = ?`, auditID).Scan(dst...); err != nil {
			t.Fatal(err)
		}
	}
	dst := []any{&writer, &holder, &stamp, &fm, &code, &causes, &us, &evTime, &raw}
	q("a3b4c5d6-0000-4000-8000-000000000007", dst...)
	if holder != "ctrl-7f9c_4b1e2d3c" || stamp != "900" || code != 200 {
		t.Errorf("lease row: holder %q stamp %q code %d", holder, stamp, code)
	}
	q("a3b4c5d6-0000-4000-8000-000000000002", dst...)
	if fm != "bob-tool" || len(causes) != 1 || causes[0] != "FieldManagerConflict" || writer != "bob" {
		t.Errorf("field conflict row: manager %q causes %q writer %q", fm, causes, writer)
	}
	if want := micros("2026-11-29T08:50:49.004002Z"); us != uint64(want) || evTime.Unix() != want/1e6 {
		t.Errorf("event time %d / %v, want %d", us, evTime, want)
	}
	q("a3b4c5d6-0000-4000-8000-000000000009", dst...)
	if writer != "system:serviceaccount:kube-system:horizontal-pod-autoscaler" {
		t.Errorf("impersonated writer %q", writer)
	}
	q("a3b4c5d6-0000-4000-8000-000000000008", dst...)
	if strings.Contains(raw, "aHVudGVyMg") || !strings.Contains(raw, "db-password") {
		t.Errorf("secret raw event: %s", raw)
	}
}

func TestDeadLettersAreStoredWithReason(t *testing.T) {
	st, _ := newStore(t, false)
	dead := []audit.DeadLetter{{Cluster: "prod", Source: "webhook", Reason: "event has no auditID", Raw: `{"stage":"x"}`, ReceivedAt: time.Now().UnixMicro()}}
	res, err := st.InsertRecords(t.Context(), recordtest.Set(nil, dead))
	if err != nil || res.Dead != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if n := count(t, st, "SELECT count() FROM {db}.dead_letters WHERE reason = ? AND raw = ?", dead[0].Reason, dead[0].Raw); n != 1 {
		t.Errorf("dead letter rows %d, want 1", n)
	}
}

func TestRetentionDropsWholeDays(t *testing.T) {
	st, _ := newStore(t, false)
	base := audittest.Events(t)[:1]
	var rows []audit.Row
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for day := range 5 {
		r := audittest.Rows(t, "prod", base)[0]
		r.AuditID = fmt.Sprintf("day-%d", day)
		r.StageMicros = now.AddDate(0, 0, -day).UnixMicro()
		r.Fingerprint = audit.Fingerprint(&r)
		rows = append(rows, r)
	}
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	dropped, err := st.DropPartitionsBefore(t.Context(), now.AddDate(0, 0, -2))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(dropped, ",") != "2026-11-25,2026-11-26" {
		t.Errorf("dropped %v", dropped)
	}
	if n := count(t, st, "SELECT count() FROM {db}.events_by_hour"); n != 3 {
		t.Errorf("%d events left, want 3", n)
	}
	if n := count(t, st, "SELECT count() FROM {db}.hour_marks"); n != 3 {
		t.Errorf("%d hour marks left, want 3", n)
	}
}

// processTB lets a server outlive the test that started it: its cleanups run
// at process exit via TestMain.
type processTB struct {
	testing.TB
}

var processCleanups []func()

func (p *processTB) Cleanup(f func()) { processCleanups = append(processCleanups, f) }
func (p *processTB) TempDir() string  { return mkTemp() }
func (p *processTB) Context() context.Context {
	return context.Background()
}

func TestParseDSNTakesCredentialsAndTLSFromTheDSN(t *testing.T) {
	dir := t.TempDir()
	caFile := pkitest.NewCA("ca").WriteFile(t, dir)
	opts, err := ParseDSN("clickhouse://sink:pw@127.0.0.1:9440/db?secure=true&ca_file=" + caFile + "&dial_timeout=3s")
	if err != nil {
		t.Fatal(err)
	}
	if opts.Auth.Username != "sink" || opts.Auth.Password != "pw" || opts.TLS == nil || opts.TLS.RootCAs == nil {
		t.Errorf("options: user %q, TLS %+v", opts.Auth.Username, opts.TLS)
	}
	if _, ok := opts.Settings["ca_file"]; ok {
		t.Error("ca_file leaked into the server settings")
	}
	for _, bad := range []string{
		"clickhouse://127.0.0.1:9000?ca_file=" + caFile,                    // no TLS
		"clickhouse://127.0.0.1:9440?secure=true&ca_file=" + dir + "/none", // missing file
	} {
		if _, err := ParseDSN(bad); err == nil {
			t.Errorf("%s accepted", bad)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("error echoes the DSN: %v", err)
		}
	}
}

// TestMigration5CountsEventsStoredBefore: a database written at migration
// 4, with copies of events stored by racing writers back then (and so
// counted twice by its old views), is upgraded. Every event it held counts
// once, from events and from the caches built after the upgrade, and a
// redelivery after the upgrade changes no figure.
func TestMigration5CountsEventsStoredBefore(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := sharedServer(t)
	ctx := t.Context()
	st, err := Open(ctx, Options{DSN: srv.DSN(), Database: srv.NewDatabase(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	steps := MigrateSetupSQL(st.db)
	for _, m := range Migrations[:4] {
		steps = append(steps, m.SQL(st.db)...)
	}
	for _, q := range steps {
		if err := st.conn.Exec(ctx, q); err != nil {
			t.Fatalf("migrate to 4: %v\n%s", err, q)
		}
	}
	old := exactRows(t, "old")
	want := truth(t, old)
	since, until := window(old)
	set := recordtest.Set(old, nil)
	refs := set.Events()
	st.events = asql.LegacyEventsTable // sinks of migration 4 stored there
	// Two racing writers of migration 4, neither saw the other.
	for range 2 {
		if err := st.insertEvents(ctx, refs); err != nil {
			t.Fatal(err)
		}
	}
	st.events = asql.EventsTable
	if n := count(t, st, "SELECT toUInt64(sum(requests)) FROM {db}.request_rollup"); n <= uint64(len(old)/2) {
		t.Fatalf("the old rollup counted %d requests: the copies did not reach it", n)
	}
	if applied, err := st.Migrate(ctx); err != nil || !slices.Equal(applied, versionsFrom(5)) {
		t.Fatalf("upgrade applied %v (%v), want %v", applied, err, versionsFrom(5))
	}
	requireTruth(t, st, want, since, until, "after the upgrade")
	if _, err := st.Compact(ctx, since, 0); err != nil {
		t.Fatal(err)
	}
	if n := cleanHours(t, st, since, until); n == 0 {
		t.Fatal("no hour stored before the upgrade was compacted")
	}
	requireTruth(t, st, want, since, until, "after compaction")
	if _, err := st.InsertRecords(ctx, recordtest.Set(old, nil)); err != nil {
		t.Fatal(err)
	}
	requireTruth(t, st, want, since, until, "after a redelivery")
}

// TestMigration6KeepsEverySinkExact: a database at migration 5 holds events
// an older sink stored, is upgraded while that sink keeps storing (into
// events, as it always did), and a sink of this version stores the same
// events and the rest into events_by_hour at the same moment. Every event
// counts once, read raw or from the caches (the events stored before the
// upgrade live in events only, half of the later ones in both tables), and a
// redelivery by the older sink afterwards (its marks dirty the hours)
// changes no figure.
func TestMigration6KeepsEverySinkExact(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := sharedServer(t)
	ctx := t.Context()
	db := srv.NewDatabase(t)
	open := func() *Store {
		st, err := Open(ctx, Options{DSN: srv.DSN(), Database: db})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	older, newer := open(), open()
	older.events, older.noHistories = asql.LegacyEventsTable, true // a sink of migration 5
	steps := MigrateSetupSQL(older.db)
	for _, m := range Migrations[:5] {
		steps = append(steps, m.SQL(older.db)...)
	}
	for _, q := range steps {
		if err := older.conn.Exec(ctx, q); err != nil {
			t.Fatalf("migrate to 5: %v\n%s", err, q)
		}
	}
	before, during := exactRows(t, "before-6"), exactRows(t, "during-6")
	all := append(append([]audit.Row(nil), before...), during...)
	want := truth(t, all)
	since, until := window(all)
	if _, err := older.InsertRecords(ctx, recordtest.Set(before, nil)); err != nil {
		t.Fatal(err)
	}
	if applied, err := newer.Migrate(ctx); err != nil || !slices.Equal(applied, versionsFrom(6)) {
		t.Fatalf("upgrade applied %v (%v), want %v", applied, err, versionsFrom(6))
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { _, errs[0] = older.InsertRecords(ctx, recordtest.Set(during[:len(during)/2], nil)) })
	wg.Go(func() { _, errs[1] = newer.InsertRecords(ctx, recordtest.Set(during, nil)) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{asql.EventsTable, asql.LegacyEventsTable} {
		if n := count(t, newer, "SELECT count() FROM {db}."+table); n == 0 {
			t.Fatalf("%s holds no events: the test stores into both tables", table)
		}
	}
	requireTruth(t, newer, want, since, until, "after the upgrade")
	if _, err := newer.Compact(ctx, since, 0); err != nil {
		t.Fatal(err)
	}
	clean := cleanHours(t, newer, since, until)
	if clean == 0 {
		t.Fatal("no hour is clean after a compaction")
	}
	requireTruth(t, newer, want, since, until, "after compaction")
	// A part of a batch again: a block of its own, so a mark of its own.
	if _, err := older.InsertRecords(ctx, recordtest.Set(before[:len(before)/3], nil)); err != nil {
		t.Fatal(err)
	}
	if n := cleanHours(t, newer, since, until); n >= clean {
		t.Fatalf("%d of %d hours still clean after the older sink's redelivery: its marks are not counted", n, clean)
	}
	requireTruth(t, newer, want, since, until, "after the older sink's redelivery")
}

// TestFieldHistoriesReadBack stores more field history rows in one insert
// than one block holds (insertBlockRows), and reads every column of each
// back as the row said it.
func TestFieldHistoriesReadBack(t *testing.T) {
	st, _ := newStore(t, false)
	n := 2*insertBlockRows + 5
	rows := make([]audit.Row, n)
	base := micros("2026-11-29T23:59:50Z")
	for i := range rows {
		rows[i] = audit.Row{Cluster: "prod", AuditID: fmt.Sprintf("h-%05d", i), Stage: audit.StageResponseComplete, Level: "RequestResponse",
			Verb: []string{"update", "patch", "create"}[i%3], User: fmt.Sprintf("user-%d", i%7), ImpersonatedUser: map[bool]string{true: "imp"}[i%11 == 0],
			APIGroup: "apps", APIVersion: "v1", Resource: "deployments", Subresource: map[bool]string{true: "scale"}[i%13 == 0],
			Namespace: fmt.Sprintf("ns-%d", i%5), Name: fmt.Sprintf("web-%d", i%97), Code: 200, Stamp: strconv.Itoa(i), FieldManager: "kubectl-replace",
			RequestReceivedMicros: base + int64(i)*1000 - 500, StageMicros: base + int64(i)*1000, // across midnight: two days
			ObjectVersion: uint64(1000 + i), FullView: i%13 != 0, RequestManaged: i%2 == 0, Force: i%3 == 1, Apply: i%6 == 1, Created: i%3 == 2,
			Fields: audit.Fields{Paths: []string{"spec.replicas", fmt.Sprintf("metadata.labels[%q]", "l"+strconv.Itoa(i%4))}, Hashes: []uint64{uint64(i), uint64(i) * 3}}}
		rows[i].Fingerprint = audit.Fingerprint(&rows[i])
	}
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	got, err := st.conn.Query(t.Context(), `SELECT event_date, cluster, api_group, resource, namespace, name, object_version, event_time_us, request_received_us,
		audit_id, stage, fingerprint, verb, subresource, writer, field_manager, stamp, full_view, request_managed, force, apply, created, field_paths, field_hashes
		FROM `+st.db+`.field_versions ORDER BY audit_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	i := 0
	for ; got.Next(); i++ {
		var (
			day                                           time.Time
			cluster, group, resource, ns, name, id, stage string
			verb, sub, writer, fm, stamp                  string
			version, at, received, fingerprint            uint64
			full, managed, force, apply, created          uint8
			paths                                         []string
			hashes                                        []uint64
		)
		if err := got.Scan(&day, &cluster, &group, &resource, &ns, &name, &version, &at, &received, &id, &stage, &fingerprint,
			&verb, &sub, &writer, &fm, &stamp, &full, &managed, &force, &apply, &created, &paths, &hashes); err != nil {
			t.Fatal(err)
		}
		if i >= n {
			continue // counted below
		}
		r := rows[i]
		b := func(v bool) uint8 {
			if v {
				return 1
			}
			return 0
		}
		want := []any{time.UnixMicro(r.StageMicros).UTC().Format(time.DateOnly), r.Cluster, r.APIGroup, r.Resource, r.Namespace, r.Name, r.ObjectVersion,
			uint64(r.StageMicros), uint64(r.RequestReceivedMicros), r.AuditID, r.Stage, r.Fingerprint, r.Verb, r.Subresource, r.Writer(), r.FieldManager, r.Stamp,
			b(r.FullView), b(r.RequestManaged), b(r.Force), b(r.Apply), b(r.Created), r.Fields.Paths, r.Fields.Hashes}
		have := []any{day.Format(time.DateOnly), cluster, group, resource, ns, name, version, at, received, id, stage, fingerprint, verb, sub, writer, fm, stamp,
			full, managed, force, apply, created, paths, hashes}
		if !reflect.DeepEqual(have, want) {
			t.Fatalf("field history row %d:\n got %v\nwant %v", i, have, want)
		}
	}
	if err := got.Err(); err != nil {
		t.Fatal(err)
	}
	if i != n {
		t.Fatalf("field_versions holds %d rows, want %d", i, n)
	}
}

// versionsFrom are the versions of the migrations from v on, in order:
// what an upgrade from a database at v-1 applies.
func versionsFrom(v int) []int {
	var vs []int
	for _, m := range Migrations {
		if m.Version >= v {
			vs = append(vs, m.Version)
		}
	}
	return vs
}
