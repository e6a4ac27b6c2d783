package analytics

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/analytics/audit"
	asql "github.com/stampguard/stampguard/analytics/sql"
)

// racingRows are copies of the real events under fresh audit IDs, so that
// each round inserts keys no earlier round stored.
func racingRows(t *testing.T, round int) []audit.Row {
	t.Helper()
	rows := decodeAll(t, "race", realEvents(t))
	for i := range rows {
		rows[i].AuditID = fmt.Sprintf("r%d-%s", round, rows[i].AuditID)
		rows[i].Fingerprint = audit.Fingerprint(&rows[i])
	}
	return rows
}

// raceInserts has every store insert rowsOf(its index) at the same moment,
// skipping the key lookup so that each one inserts, and returns the most
// doubled rows any store's check saw.
func raceInserts(t *testing.T, stores []*Store, rowsOf func(i int) []audit.Row) int {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make([]InsertResult, len(stores))
	errs := make([]error, len(stores))
	for i, st := range stores {
		set, err := recordSetOf(rowsOf(i), nil, false)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			results[i], errs[i] = st.insertRecords(t.Context(), set, false)
		})
	}
	close(start)
	wg.Wait()
	doubled := 0
	for i := range stores {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		doubled = max(doubled, results[i].Doubled)
	}
	return doubled
}

// TestRacingWritersRecordEveryCopy forces the race the key lookup cannot
// prevent: n stores insert the same rows at once and skip the lookup, so
// every one of them inserts. Each insert's check then runs after its own
// insert returned, so the last check sees all n copies: duplicate_events
// must name every row with copies = n, however the inserts interleaved.
func TestRacingWritersRecordEveryCopy(t *testing.T) {
	first, srv := newStore(t, false)
	for _, writers := range []int{2, 3} {
		stores := []*Store{first}
		for range writers - 1 {
			st, err := OpenStore(t.Context(), StoreOptions{DSN: srv.DSN(), Database: first.db})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			stores = append(stores, st)
		}
		for round := range 5 {
			round += writers * 100
			rows := racingRows(t, round)
			doubled := raceInserts(t, stores, func(int) []audit.Row { return rows })
			prefix := fmt.Sprintf("r%d-%%", round)
			if n := count(t, first, "SELECT count() FROM {db}.stored_keys WHERE audit_id LIKE ?", prefix); n != uint64(writers*len(rows)) {
				t.Fatalf("%d writers, round %d: stored_keys holds %d copies, want %d", writers, round, n, writers*len(rows))
			}
			if doubled != len(rows) {
				t.Errorf("%d writers, round %d: the last check saw %d doubled rows, want %d", writers, round, doubled, len(rows))
			}
			if n := count(t, first, "SELECT count() FROM {db}.duplicate_events FINAL WHERE audit_id LIKE ? AND copies = ?", prefix, writers); n != uint64(len(rows)) {
				t.Errorf("%d writers, round %d: duplicate_events names %d rows with %d copies, want %d", writers, round, n, writers, len(rows))
			}
		}
	}
	// The rollup counted every copy; minus (copies-1) per duplicate it
	// counts each request once.
	requests := count(t, first, "SELECT count() FROM (SELECT DISTINCT cluster, audit_id, stage, fingerprint FROM {db}.events WHERE "+asql.Request+")")
	rolled := count(t, first, "SELECT toUInt64(sum(requests)) FROM {db}.request_rollup")
	excess := count(t, first, "SELECT toUInt64(sum(copies - 1)) FROM {db}.duplicate_events FINAL WHERE "+asql.Request)
	if requests == 0 || rolled-excess != requests {
		t.Errorf("the rollup counts %d requests, duplicates %d extra: %d, want %d", rolled, excess, rolled-excess, requests)
	}
}

// TestInsertAfterARaceRecordsTheCopies: a writer that finds a key stored
// twice before its insert (a replay after it crashed between its insert
// and its check) records the copies and stores nothing.
func TestInsertAfterARaceRecordsTheCopies(t *testing.T) {
	st, _ := newStore(t, false)
	rows := racingRows(t, 1)
	for range 2 {
		set, err := recordSetOf(rows, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.insertEvents(t.Context(), set.rows); err != nil { // no check: the "crash"
			t.Fatal(err)
		}
	}
	if n := count(t, st, "SELECT count() FROM {db}.duplicate_events"); n != 0 {
		t.Fatalf("duplicate_events has %d rows before any check", n)
	}
	res, err := st.Insert(t.Context(), rows, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stored != 0 || res.Doubled != len(rows) {
		t.Fatalf("replay: %+v, want nothing stored and %d doubled", res, len(rows))
	}
	if n := count(t, st, "SELECT count() FROM {db}.duplicate_events FINAL WHERE copies = 2"); n != uint64(len(rows)) {
		t.Fatalf("duplicate_events names %d rows with 2 copies, want %d", n, len(rows))
	}
}

// TestScanDuplicatesFindsUncheckedCopies: copies no writer checked (both
// writers killed after their inserts) are found by the scan, which is
// idempotent and keeps the events' own columns.
func TestScanDuplicatesFindsUncheckedCopies(t *testing.T) {
	st, _ := newStore(t, true)
	rows := racingRows(t, 2)
	for copies := range 3 {
		set, err := recordSetOf(rows[:copies+2], nil, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.insertEvents(t.Context(), set.rows); err != nil {
			t.Fatal(err)
		}
	}
	// rows[0] and rows[1] are stored 3 times, rows[2] twice, rows[3] once.
	for range 2 {
		if err := st.ScanDuplicates(t.Context(), time.Unix(0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]uint32{}
	res, err := st.conn.Query(t.Context(), "SELECT audit_id, copies FROM "+st.db+".duplicate_events FINAL")
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var id string
		var c uint32
		if err := res.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		got[id] = c
	}
	res.Close()
	want := map[string]uint32{rows[0].AuditID: 3, rows[1].AuditID: 3, rows[2].AuditID: 2}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("duplicate_events %v, want %v", got, want)
	}
	if n := count(t, st, "SELECT count() FROM {db}.duplicate_events d WHERE raw = ''"); n != 0 {
		t.Errorf("%d duplicates lost the event's columns", n)
	}
}

// TestCheckReadsOnlyRecentParts: the check after an insert reads the parts
// of stored_keys written since its lookup started, so it sees copies
// stored now, also once merged, and not copies stored before (which that
// lookup would have seen); the whole check sees both.
func TestCheckReadsOnlyRecentParts(t *testing.T) {
	st, _ := newStore(t, false)
	ctx := t.Context()
	rows := racingRows(t, 3)
	set, err := recordSetOf(rows[:2], nil, false)
	if err != nil {
		t.Fatal(err)
	}
	refs, _ := dedup(set.rows, nil)
	insert := func(r rowRef) {
		t.Helper()
		for range 2 {
			if err := st.insertEvents(ctx, []rowRef{r}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// refs[1]: two copies in parts older than the margin, beside 100,000
	// other keys of the day; refs[0]: two copies stored after the lookup
	// started.
	insert(refs[1])
	if err := st.conn.Exec(ctx, "INSERT INTO "+st.db+".stored_keys (event_date, cluster, audit_id, stage, fingerprint) SELECT toDate(?), ?, toString(number), 'ResponseComplete', number FROM system.numbers LIMIT 100000",
		time.UnixMicro(refs[1].micros).UTC().Format(time.DateOnly), refs[1].key.cluster); err != nil {
		t.Fatal(err)
	}
	time.Sleep(recentMargin + 2*time.Second)
	since := time.Now()
	insert(refs[0])
	check := func(q keyQuery, want ...eventKey) {
		t.Helper()
		got := map[eventKey]uint32{}
		qctx := ctx
		if !q.since.IsZero() {
			// The old parts are skipped, not read and filtered.
			qctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_rows_to_read": 50000}))
		}
		if err := st.lookupKeys(qctx, refs, q, func(k eventKey, n uint32) { got[k] = n }); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("since %v: found %v, want %v", q.since, got, want)
		}
		for _, k := range want {
			if got[k] != 2 {
				t.Errorf("since %v: %v has %d copies, want 2", q.since, k, got[k])
			}
		}
	}
	check(keyQuery{doubled: true, since: since}, refs[0].key)
	check(keyQuery{doubled: true}, refs[0].key, refs[1].key)
	// A merge writes a new part holding the recent copies: still read
	// (here with the old ones, all in one part).
	if err := st.conn.Exec(ctx, "OPTIMIZE TABLE "+st.db+".stored_keys FINAL"); err != nil {
		t.Fatal(err)
	}
	check(keyQuery{doubled: true}, refs[0].key, refs[1].key)
	var parts uint64
	if err := st.conn.QueryRow(ctx, "SELECT count() FROM system.parts WHERE database = ? AND table = 'stored_keys' AND active", st.db).Scan(&parts); err != nil || parts != 1 {
		t.Fatalf("%d active parts after OPTIMIZE FINAL (%v), want 1", parts, err)
	}
	got := map[eventKey]uint32{}
	if err := st.lookupKeys(ctx, refs, keyQuery{doubled: true, since: since}, func(k eventKey, n uint32) { got[k] = n }); err != nil {
		t.Fatal(err)
	}
	if got[refs[0].key] != 2 {
		t.Errorf("after the merge the recent copies read %v, want 2 copies of %v", got, refs[0].key)
	}
}

// TestCheckAfterAQuietInsertReadsNothing: when the parts of stored_keys
// new since the lookup hold just the batch's rows, no writer raced it and
// the check reads nothing (a read of the batch's part would exceed
// max_rows_to_read here). When another writer stored copies of the same
// rows after the lookup, the check reads the parts new since the lookup
// and finds every copy.
func TestCheckAfterAQuietInsertReadsNothing(t *testing.T) {
	st, srv := newStore(t, false)
	ctx := t.Context()
	other, err := OpenStore(ctx, StoreOptions{DSN: srv.DSN(), Database: st.db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	batch := func(round int) []rowRef {
		var rows []audit.Row
		for i := range 40 {
			rows = append(rows, racingRows(t, round*1000+i)...)
		}
		set, err := recordSetOf(rows, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		refs, _ := dedup(set.rows, nil)
		return refs
	}
	lookedUp := func() keyQuery {
		t.Helper()
		q := keyQuery{doubled: true, since: time.Now()}
		if q.known, err = st.recentParts(ctx, secondsBack(q.since, recentMargin)+1); err != nil {
			t.Fatal(err)
		}
		return q
	}
	check := func(qctx context.Context, refs []rowRef, q keyQuery) map[eventKey]uint32 {
		t.Helper()
		if q.recent, err = st.recentParts(ctx, secondsBack(q.since, recentMargin)); err != nil {
			t.Fatal(err)
		}
		got := map[eventKey]uint32{}
		if err := st.lookupKeys(qctx, refs, q, func(k eventKey, n uint32) { got[k] = n }); err != nil {
			t.Fatal(err)
		}
		return got
	}

	quiet := batch(1)
	if len(quiet) < 100 {
		t.Fatalf("%d rows: too few for max_rows_to_read to tell a read", len(quiet))
	}
	q := lookedUp()
	if err := st.insertEvents(ctx, quiet); err != nil {
		t.Fatal(err)
	}
	noRead := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_rows_to_read": len(quiet) / 2}))
	if got := check(noRead, quiet, q); len(got) != 0 {
		t.Errorf("quiet insert: the check found %v", got)
	}

	// The racer stores after the lookup started, so the check reads: the
	// parts new since the lookup, and not the quiet batch's part, still
	// within the check's window but listed before the lookup (merges
	// stopped, so that no new part holds it). 18.16 judges
	// max_rows_to_read before it reads, by whole granules, a part this
	// small as one (8192 rows). The hashes' read takes two parts, their
	// keys' read the same two twice (its IN subquery reads them too): four
	// granules; with the quiet part they would be three and six.
	raced := batch(2)
	if err := st.conn.Exec(ctx, "SYSTEM STOP MERGES "+st.db+".stored_keys"); err != nil {
		t.Fatal(err)
	}
	q = lookedUp()
	if err := other.insertEvents(ctx, raced); err != nil { // the racer, after the lookup
		t.Fatal(err)
	}
	if err := st.insertEvents(ctx, raced); err != nil {
		t.Fatal(err)
	}
	newOnly := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_rows_to_read": 5 * 8192}))
	got := check(newOnly, raced, q)
	if len(got) != len(raced) {
		t.Errorf("raced insert: the check found %d doubled rows, want %d", len(got), len(raced))
	}
	for k, n := range got {
		if n != 2 {
			t.Errorf("raced insert: %v has %d copies, want 2", k, n)
		}
	}
}
