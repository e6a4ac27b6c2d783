package analytics

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/internal/chtest"

	"github.com/stampguard/stampguard/internal/testenv"
)

// newStore starts (once per test binary) a ClickHouse server and returns a
// migrated store on a fresh database.
func newStore(t *testing.T, keepRaw bool) (*Store, *chtest.Server) {
	t.Helper()
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := sharedServer(t)
	db := srv.NewDatabase(t)
	st, err := OpenStore(t.Context(), StoreOptions{DSN: srv.DSN(), Database: db, KeepRaw: keepRaw})
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

func count(t *testing.T, st *Store, query string, args ...any) uint64 {
	t.Helper()
	var n uint64
	if err := st.conn.QueryRow(t.Context(), strings.ReplaceAll(query, "{db}", st.db), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func decodeAll(t testing.TB, cluster string, lines []string) []audit.Row {
	t.Helper()
	d := audit.Decoder{KeepRaw: true}
	rows := make([]audit.Row, len(lines))
	for i, l := range lines {
		if err := d.Decode(l, &rows[i]); err != nil {
			t.Fatal(err)
		}
		rows[i].Cluster = cluster
	}
	return rows
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

func TestInsertStoresEachEventOnce(t *testing.T) {
	st, _ := newStore(t, true)
	rows := decodeAll(t, "prod", realEvents(t))
	ctx := t.Context()

	res, err := st.Insert(ctx, rows, nil)
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
	}{
		{"a redelivered batch stores nothing", rows, 0, len(rows)},
		{"a batch repeating an event within itself stores it once", append(decodeAll(t, "staging", realEvents(t)[:2]), decodeAll(t, "staging", realEvents(t)[:2])...), 2, 2},
		{"the same events from another cluster are new", decodeAll(t, "dev", realEvents(t)[:3]), 3, 0},
		{"a reused audit ID of a different request is a new row", func() []audit.Row {
			r := decodeAll(t, "prod", realEvents(t)[:1])
			r[0].StageMicros++
			r[0].Fingerprint = audit.Fingerprint(&r[0])
			return r
		}(), 1, 0},
	}
	total := len(rows)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := st.Insert(ctx, tt.rows, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Stored != tt.wantStored || res.Duplicates != tt.wantDropped {
				t.Errorf("%+v, want %d stored and %d dropped", res, tt.wantStored, tt.wantDropped)
			}
			total += tt.wantStored
			if n := count(t, st, "SELECT count() FROM {db}.events"); n != uint64(total) {
				t.Errorf("events has %d rows, want %d", n, total)
			}
		})
	}
	if n := count(t, st, "SELECT count() FROM {db}.stored_keys"); n != uint64(total) {
		t.Errorf("stored_keys has %d rows, want %d", n, total)
	}
}

func TestInsertedRowsReadBack(t *testing.T) {
	st, _ := newStore(t, true)
	rows := decodeAll(t, "prod", realEvents(t))
	if _, err := st.Insert(t.Context(), rows, nil); err != nil {
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
			cause_reasons, event_time_us, event_time, raw FROM `+st.db+`.events WHERE audit_id = ?`, auditID).Scan(dst...); err != nil {
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
	res, err := st.Insert(t.Context(), nil, dead)
	if err != nil || res.Dead != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if n := count(t, st, "SELECT count() FROM {db}.dead_letters WHERE reason = ? AND raw = ?", dead[0].Reason, dead[0].Raw); n != 1 {
		t.Errorf("dead letter rows %d, want 1", n)
	}
}

func TestRetentionDropsWholeDays(t *testing.T) {
	st, _ := newStore(t, false)
	base := realEvents(t)[:1]
	var rows []audit.Row
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for day := range 5 {
		r := decodeAll(t, "prod", base)[0]
		r.AuditID = fmt.Sprintf("day-%d", day)
		r.StageMicros = now.AddDate(0, 0, -day).UnixMicro()
		r.Fingerprint = audit.Fingerprint(&r)
		rows = append(rows, r)
	}
	if _, err := st.Insert(t.Context(), rows, nil); err != nil {
		t.Fatal(err)
	}
	dropped, err := st.DropPartitionsBefore(t.Context(), now.AddDate(0, 0, -2))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(dropped, ",") != "2026-11-25,2026-11-26" {
		t.Errorf("dropped %v", dropped)
	}
	if n := count(t, st, "SELECT count() FROM {db}.events"); n != 3 {
		t.Errorf("%d events left, want 3", n)
	}
	if n := count(t, st, "SELECT count() FROM {db}.stored_keys"); n != 3 {
		t.Errorf("%d keys left, want 3", n)
	}
	if n := count(t, st, "SELECT toUInt64(sum(requests)) FROM {db}.request_rollup"); n != 3 {
		t.Errorf("the report rollup counts %d requests after retention, want 3", n)
	}
}

func TestBatchRecordRoundTrips(t *testing.T) {
	rows := decodeAll(t, "prod", realEvents(t))
	in := Batch{Cluster: "prod", Rows: rows, Dead: []audit.DeadLetter{{Cluster: "prod", Source: "file", Reason: "r", Raw: "x", ReceivedAt: 42}}}
	rec := AppendBatch(nil, &in)
	out, err := DecodeBatch(string(rec))
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		normalize(&rows[i])
		r := out.Rows[i]
		r.Raw = ""
		normalize(&r)
		if fmt.Sprintf("%+v", r) != fmt.Sprintf("%+v", rows[i]) {
			t.Errorf("row %d:\n got %+v\nwant %+v", i, r, rows[i])
		}
	}
	if len(out.Dead) != 1 || out.Dead[0] != in.Dead[0] {
		t.Errorf("dead letters %+v", out.Dead)
	}
	// The spool's checksums catch damage; a cut record still never
	// decodes as the whole.
	for cut := range len(rec) {
		if b, err := DecodeBatch(string(rec[:cut])); err == nil && len(b.Rows)+len(b.Dead) >= len(rows)+1 {
			t.Fatalf("a record cut at %d of %d decoded whole", cut, len(rec))
		}
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
	caFile := dir + "/ca.pem"
	if err := os.WriteFile(caFile, testCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
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

// testCA is a fresh self-signed CA certificate in PEM.
func testCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestDuplicateEventsHoldWholeEvents: migration 4 writes duplicate_events'
// columns out as fixed text (a released migration must not follow later
// edits), so this test keeps them equal to events' columns, in order, plus
// copies; the report computes a duplicate's counters from them.
func TestDuplicateEventsHoldWholeEvents(t *testing.T) {
	st, _ := newStore(t, false)
	columns := func(table string) []string {
		rows, err := st.conn.Query(t.Context(), "SELECT name, type FROM system.columns WHERE database = ? AND table = ?", st.db, table) // in definition order (18.16 has no position column)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var name, typ string
			if err := rows.Scan(&name, &typ); err != nil {
				t.Fatal(err)
			}
			out = append(out, name+" "+typ)
		}
		return out
	}
	events, dups := columns("events"), columns("duplicate_events")
	want := append(append([]string(nil), events...), "copies UInt32")
	if strings.Join(dups, ", ") != strings.Join(want, ", ") {
		t.Errorf("duplicate_events columns\n%v\nwant events' columns and copies\n%v", dups, want)
	}
}

// TestEventsStoredBeforeMigration4StayStored: a database written at
// migration 3 knows its events in event_keys only. After the upgrade the
// lookup still finds them on their days (a redelivery stores nothing),
// and reads stored_keys alone on days event_keys holds nothing of.
func TestEventsStoredBeforeMigration4StayStored(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	srv := sharedServer(t)
	ctx := t.Context()
	st, err := OpenStore(ctx, StoreOptions{DSN: srv.DSN(), Database: srv.NewDatabase(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	steps := MigrateSetupSQL(st.db)
	for _, m := range Migrations[:3] {
		steps = append(steps, m.SQL(st.db)...)
	}
	for _, q := range steps {
		if err := st.conn.Exec(ctx, q); err != nil {
			t.Fatalf("migrate to 3: %v\n%s", err, q)
		}
	}
	if v, err := st.SchemaVersion(ctx); err != nil || v != 3 {
		t.Fatalf("schema version %d (%v), want 3", v, err)
	}
	old := decodeAll(t, "prod", realEvents(t))
	set, err := recordSetOf(old, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	refs, _ := dedup(set.rows, nil)
	if err := st.insertEvents(ctx, refs); err != nil { // as the writer at migration 3 did
		t.Fatal(err)
	}
	if applied, err := st.Migrate(ctx); err != nil || !slices.Contains(applied, 4) {
		t.Fatalf("upgrade applied %v (%v), want 4 among them", applied, err)
	}
	day := time.UnixMicro(refs[0].micros).UTC().Format(time.DateOnly)
	if !st.legacyOn([]any{day}) {
		t.Errorf("after the upgrade the lookup skips event_keys on %s, the day it holds", day)
	}

	res, err := st.Insert(ctx, old, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stored != 0 || res.Duplicates != len(old) {
		t.Errorf("redelivery after the upgrade: %+v, want all %d dropped", res, len(old))
	}
	later := decodeAll(t, "prod", realEvents(t))
	for i := range later {
		later[i].StageMicros += 3 * 86_400_000_000
		later[i].RequestReceivedMicros += 3 * 86_400_000_000
		later[i].Fingerprint = audit.Fingerprint(&later[i])
	}
	laterDay := time.UnixMicro(later[0].StageMicros).UTC().Format(time.DateOnly)
	if st.legacyOn([]any{laterDay}) {
		t.Errorf("the lookup reads event_keys on %s, a day it holds nothing of", laterDay)
	}
	for round, want := range []int{len(later), 0} {
		res, err := st.Insert(ctx, later, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Stored != want || res.Duplicates != len(later)-want {
			t.Errorf("round %d on %s: %+v, want %d stored", round, laterDay, res, want)
		}
	}
}
