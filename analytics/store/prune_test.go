package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

// TestPruneDeletesOnlyVersionsNoReaderTakes recompacts hours the ways
// that supersede a version (a compaction of a clean hour, a copy stored
// into a compacted hour) and prunes after each: every superseded
// version's rows and record go once the grace has passed, and none
// before, with the blocks built from them; the newest clean version of each hour, a clean version of an
// earlier release's layout, and a compaction still writing its caches
// keep every row; and the report equals the ground truth throughout.
func TestPruneDeletesOnlyVersionsNoReaderTakes(t *testing.T) {
	first, late := twoHours(t, "prune"), twoHours(t, "prune-late")
	since, until := window(first)
	want := truth(t, first)
	all := append(append([]audit.Row(nil), first...), late...)
	wantAll := truth(t, all)

	st, _ := newStore(t, false)
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(first, nil)); err != nil {
		t.Fatal(err)
	}
	res, err := st.Compact(t.Context(), since, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The two hours (from 08:00) make a block of two, built from their
	// first versions.
	if len(res.Blocks) != 1 {
		t.Fatalf("the compaction built blocks %v, want one of the two hours", res.Blocks)
	}
	b1 := res.Blocks[0]
	b1Rows := blockRows(t, st, b1.Version)
	if b1Rows == 0 {
		t.Fatal("the block holds no rows")
	}
	v1 := recordedVersions(t, st)
	if len(v1) < 2 {
		t.Fatalf("%d hours compacted; the test needs two or more", len(v1))
	}
	// An earlier release's clean record of one hour, with rows of its own
	// in a cache: its readers take it, whatever this release does.
	earlier := slices.MinFunc(slices.Collect(maps.Keys(v1)), time.Time.Compare)
	const earlierVersion = 1
	for _, q := range []string{
		fmt.Sprintf("INSERT INTO {db}.hour_compactions (event_date, hour, version, marks, compacted_at) SELECT event_date, hour, toUInt64(%d), marks, now() - 7200 FROM {db}.hour_caches WHERE version = %d",
			earlierVersion, v1[earlier]),
		fmt.Sprintf("INSERT INTO {db}.hour_loop_successes (event_date, hour, version, cluster, pair, event_time_us) SELECT event_date, hour, toUInt64(%d), cluster, pair, event_time_us FROM {db}.hour_loop_successes WHERE version = %d",
			earlierVersion, v1[earlier]),
	} {
		if err := st.conn.Exec(t.Context(), st.sql(q)); err != nil {
			t.Fatal(err)
		}
	}
	earlierRows := versionRows(t, st, earlierVersion)
	if earlierRows == 0 {
		t.Fatal("the earlier release's version has no rows: the hour has no successful writes")
	}
	requirePruned(t, st, time.Hour, 0, "with one version of each hour")

	// Compacted again, each hour, a second later (so that the newest
	// record is the one recorded last): the first versions are
	// superseded, but only just.
	afterASecond()
	for h := range v1 {
		if err := st.CompactHour(t.Context(), h); err != nil {
			t.Fatal(err)
		}
	}
	v2 := recordedVersions(t, st)
	rows1, rows2 := versionRows(t, st, values(v1)...), versionRows(t, st, values(v2)...)
	requirePruned(t, st, time.Hour, 0, "while the superseding records are younger than the grace")
	if got := versionRows(t, st, values(v1)...); got != rows1 {
		t.Fatalf("the superseded versions hold %d rows after a prune within the grace, %d before", got, rows1)
	}
	if got := blockRows(t, st, b1.Version); got != b1Rows {
		t.Fatalf("the block of the superseded versions holds %d rows after a prune within the grace, %d before", got, b1Rows)
	}
	afterASecond()
	// The superseded hour versions, and the block built from them.
	requirePruned(t, st, 0, len(v1)+1, "once the grace has passed")
	if got := versionRows(t, st, values(v1)...); got != 0 {
		t.Errorf("the superseded versions still hold %d rows", got)
	}
	if got := blockRows(t, st, b1.Version); got != 0 || count(t, st, "SELECT count() FROM {db}.block_caches") != 0 {
		t.Errorf("the block of the superseded versions still holds %d rows", got)
	}
	if got := versionRows(t, st, values(v2)...); got != rows2 {
		t.Errorf("the newest versions hold %d rows after the prune, %d before", got, rows2)
	}
	if got := versionRows(t, st, earlierVersion); got != earlierRows {
		t.Errorf("the earlier release's clean version holds %d rows after the prune, %d before", got, earlierRows)
	}
	if got := recordedVersions(t, st); !maps.Equal(got, v2) || count(t, st, "SELECT count() FROM {db}.hour_caches") != uint64(len(v2)) {
		t.Errorf("records after the prune: %v, want the newest only, %v", got, v2)
	}
	if n := cleanHours(t, st, since, until); n != uint64(len(v2)) {
		t.Errorf("%d hours clean after the prune, want %d", n, len(v2))
	}
	requireTruth(t, st, want, since, until, "after pruning the superseded versions")
	requirePruned(t, st, 0, 0, "again, with nothing superseded since")

	// A copy stored into the compacted hours: every record is dirty, the
	// earlier release's too.
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(all, nil)); err != nil {
		t.Fatal(err)
	}
	requirePruned(t, st, time.Hour, 0, "while the hours' last marks are younger than the grace")
	afterASecond()
	requirePruned(t, st, 0, len(v2)+1, "once the dirty records' last marks are older than the grace")
	if got := versionRows(t, st, append(values(v2), earlierVersion)...); got != 0 {
		t.Errorf("the dirty versions still hold %d rows", got)
	}
	if n := count(t, st, "SELECT count() FROM {db}.hour_compactions") + count(t, st, "SELECT count() FROM {db}.hour_caches"); n != 0 {
		t.Errorf("%d records left after pruning every dirty one", n)
	}
	requireTruth(t, st, wantAll, since, until, "after pruning the dirty versions")

	// A compaction that is writing its caches, its record not yet
	// written, while a prune runs: its rows stay, and it is read once it
	// is recorded.
	res, err = st.Compact(t.Context(), since, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Blocks) != 1 {
		t.Fatalf("the compaction built blocks %v, want one of the two hours", res.Blocks)
	}
	b3 := res.Blocks[0]
	v3 := recordedVersions(t, st)
	afterASecond()
	pruned := -1
	st.hook = func(at string) {
		if at == hookCachesWritten {
			pruned = prune(t, st, 0)
		}
	}
	if err := st.CompactHour(t.Context(), earlier); err != nil {
		t.Fatal(err)
	}
	st.hook = nil
	if pruned != 0 {
		t.Errorf("a prune while a compaction wrote its caches named %d versions, want 0", pruned)
	}
	v4 := recordedVersions(t, st)[earlier]
	rows4 := versionRows(t, st, v4)
	chtest.WaitForMutations(t, st.conn, st.db)
	if got := versionRows(t, st, v4); got != rows4 || rows4 == 0 {
		t.Errorf("the compaction's version holds %d rows after a prune ran during it, %d before", got, rows4)
	}
	afterASecond()
	requirePruned(t, st, 0, 2, "the version the compaction superseded, and the block built from it")
	if got := versionRows(t, st, v3[earlier]); got != 0 {
		t.Errorf("the superseded version still holds %d rows", got)
	}
	if got := blockRows(t, st, b3.Version); got != 0 {
		t.Errorf("the block of the superseded version still holds %d rows", got)
	}
	requireTruth(t, st, wantAll, since, until, "after the last prune")
}

// twoHours are the real events under audit IDs of their own (round),
// and the same an hour later: two hours or more.
func twoHours(t *testing.T, round string) []audit.Row {
	t.Helper()
	rows := exactRows(t, round)
	for _, r := range exactRows(t, round+"-next") {
		r.RequestReceivedMicros += int64(time.Hour / time.Microsecond)
		r.StageMicros += int64(time.Hour / time.Microsecond)
		r.Fingerprint = audit.Fingerprint(&r)
		rows = append(rows, r)
	}
	return rows
}

// prune runs st.Prune with grace after.
func prune(t *testing.T, st *Store, after time.Duration) int {
	t.Helper()
	n, err := st.Prune(t.Context(), after)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// requirePruned prunes with grace after, requires it to name want
// versions, and waits for its deletes.
func requirePruned(t *testing.T, st *Store, after time.Duration, want int, when string) {
	t.Helper()
	if got := prune(t, st, after); got != want {
		t.Fatalf("%s: the prune named %d versions, want %d", when, got, want)
	}
	chtest.WaitForMutations(t, st.conn, st.db)
}

// afterASecond waits until the servers' clock (whole seconds) has moved
// past every record and mark written so far: a grace of 0 then covers
// them.
func afterASecond() { time.Sleep(1100 * time.Millisecond) }

// recordedVersions are the versions of this layout's records, by hour.
func recordedVersions(t *testing.T, st *Store) map[time.Time]uint64 {
	t.Helper()
	rows, err := st.conn.Query(t.Context(), st.sql(fmt.Sprintf("SELECT hour, version FROM {db}.hour_caches WHERE layout = %d ORDER BY hour, compacted_at", asql.CacheLayout)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	versions := map[time.Time]uint64{}
	for rows.Next() {
		var h time.Time
		var v uint64
		if err := rows.Scan(&h, &v); err != nil {
			t.Fatal(err)
		}
		versions[h.UTC()] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return versions
}

// versionRows counts the rows of the given versions in every cache table.
func versionRows(t *testing.T, st *Store, versions ...uint64) uint64 {
	t.Helper()
	var list []string
	for _, v := range versions {
		list = append(list, fmt.Sprint(v))
	}
	var n uint64
	for _, table := range asql.CacheTables {
		n += count(t, st, "SELECT count() FROM {db}."+table+" WHERE version IN ("+strings.Join(list, ", ")+")")
	}
	return n
}

// blockRows counts the rows of a block's version in the block tables.
func blockRows(t *testing.T, st *Store, version uint64) uint64 {
	t.Helper()
	var n uint64
	for _, table := range asql.BlockTables {
		n += count(t, st, fmt.Sprintf("SELECT count() FROM {db}.%s WHERE version = %d", table, version))
	}
	return n
}

func values(m map[time.Time]uint64) []uint64 {
	var vs []uint64
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}
