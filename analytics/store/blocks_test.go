package store

import (
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/internal/audit"
)

// TestBlocksAreBuiltNewestFirstWithinTheBudget compacts four clean hours
// from 08:00, which hold three blocks (two hours from 08:00 and from
// 10:00, four from 08:00), with a budget that lets each round start one:
// the rounds build the newest first and, of one start, the longest; a
// round after the last builds none, and a recompacted hour has its blocks
// built again.
func TestBlocksAreBuiltNewestFirstWithinTheBudget(t *testing.T) {
	var rows []audit.Row
	for i, round := range []string{"blocks-0", "blocks-1", "blocks-2", "blocks-3"} {
		for _, r := range exactRows(t, round) {
			r.RequestReceivedMicros += int64(i) * int64(time.Hour/time.Microsecond)
			r.StageMicros += int64(i) * int64(time.Hour/time.Microsecond)
			r.Fingerprint = audit.Fingerprint(&r)
			rows = append(rows, r)
		}
	}
	since, until := window(rows)
	if until.Sub(since) != 4*time.Hour || since.Hour() != 8 {
		t.Fatalf("the rows span [%s, %s), want the four hours from 08:00", since, until)
	}
	st, _ := newStore(t, false)
	if _, err := st.InsertRecords(t.Context(), recordtest.Set(rows, nil)); err != nil {
		t.Fatal(err)
	}
	for h := since; h.Before(until); h = h.Add(time.Hour) {
		if err := st.CompactHour(t.Context(), h); err != nil {
			t.Fatal(err)
		}
	}
	want := []struct {
		start time.Time
		hours int
	}{{since.Add(2 * time.Hour), 2}, {since, 4}, {since, 2}}
	for i, w := range want {
		built, err := st.compactBlocks(t.Context(), since, time.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(built) != 1 || !built[0].Start.Equal(w.start) || built[0].Hours != w.hours {
			t.Fatalf("round %d built %v, want the block of %d hours from %s", i, built, w.hours, w.start)
		}
	}
	if built, err := st.compactBlocks(t.Context(), since, time.Nanosecond); err != nil || len(built) != 0 {
		t.Fatalf("a round after the last built %v (%v), want none", built, err)
	}
	// 10:00 compacted again: the blocks that hold it are built again.
	if err := st.CompactHour(t.Context(), since.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	built, err := st.CompactBlocks(t.Context(), since)
	if err != nil {
		t.Fatal(err)
	}
	if len(built) != 2 || !built[0].Start.Equal(since.Add(2*time.Hour)) || built[0].Hours != 2 || !built[1].Start.Equal(since) || built[1].Hours != 4 {
		t.Errorf("after 10:00 was compacted again, built %v, want its two blocks again", built)
	}
}
