package sql

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestChooseBlocksTakesTheLongestBlockOfThePinnedVersions checks the
// blocks a plan reads: at each clean hour, the longest block that starts
// there whose record names the versions the plan pinned for every one of
// its hours; a block of other versions, or with an hour the plan does not
// hold clean, is not read, and the newest of two records of the same
// versions is.
func TestChooseBlocksTakesTheLongestBlockOfThePinnedVersions(t *testing.T) {
	h0 := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC) // a multiple of 8 hours
	hour := func(i int) time.Time { return h0.Add(time.Duration(i) * time.Hour) }
	var clean []CleanHour
	for i := range 24 {
		if i == 13 { // dirty
			continue
		}
		clean = append(clean, CleanHour{Hour: hour(i), Version: uint64(100 + i)})
	}
	versions := func(from, n int) []uint64 {
		var vs []uint64
		for i := from; i < from+n; i++ {
			vs = append(vs, uint64(100+i))
		}
		return vs
	}
	rec := func(from, n int, v uint64, vs []uint64) BlockRecord {
		return BlockRecord{Block: Block{Start: hour(from), Hours: n, Version: v}, HourVersions: vs}
	}
	stale := versions(16, 8)
	stale[3] = 7 // hour 19 was compacted again since
	records := []BlockRecord{
		rec(0, 8, 1, versions(0, 8)),
		rec(0, 4, 2, versions(0, 4)),
		rec(8, 8, 3, versions(8, 8)), // hour 13 is dirty
		rec(8, 4, 4, versions(8, 4)),
		rec(12, 2, 5, versions(12, 2)), // hour 13 is dirty
		rec(16, 8, 6, stale),
		rec(16, 4, 8, versions(16, 4)), // the newest of two records of the same versions
		rec(16, 4, 9, versions(16, 4)),
		rec(20, 4, 10, versions(20, 3)), // names too few hours
		rec(20, 2, 11, versions(20, 2)),
		rec(22, 2, 12, versions(22, 2)),
	}
	p := PlanReport(h0, hour(24), clean)
	p.ChooseBlocks(records)
	want := []Block{records[0].Block, records[3].Block, records[6].Block, records[9].Block, records[10].Block}
	if !reflect.DeepEqual(p.Blocks, want) {
		t.Errorf("blocks %v, want %v", p.Blocks, want)
	}
	// The hours outside the blocks are read from their own bounds.
	segs := p.segments()
	for _, h := range []int{12, 14, 15} {
		if !contains(segs.hours, hour(h).Unix()) {
			t.Errorf("hour %d is not read from its bounds: %s", h, segs.hours)
		}
	}
	for _, h := range []int{0, 7, 8, 11, 16, 23} {
		if contains(segs.hours, hour(h).Unix()) {
			t.Errorf("hour %d of a block is read from its bounds too: %s", h, segs.hours)
		}
	}
	// A plan without blocks reads the clean hours as before.
	p.ChooseBlocks(nil)
	if got := p.segments(); got.blocks != "" || got.hours != p.rollupWindow() {
		t.Errorf("without blocks the segments are %+v", got)
	}
}

// contains says whether sql names the hour of Unix seconds unix.
func contains(sql string, unix int64) bool {
	return strings.Contains(sql, "toDateTime("+strconv.FormatInt(unix, 10)+")")
}
