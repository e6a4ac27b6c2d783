package analytics

import (
	"strings"
	"testing"
)

// rollupSums defines the aliases is_write and class inside the first three
// counters; the others, and the report, rely on them.
func TestRollupSumsDefineTheFirstCounters(t *testing.T) {
	want := []Counter{{"requests", "1"}, {"write_attempts", "is_write"}, {"version_conflicts", "class = 'version'"}}
	for i, w := range want {
		if Counters[i] != w {
			t.Errorf("counter %d is %+v, rollupSums writes %+v", i, Counters[i], w)
		}
	}
	for _, c := range Counters {
		if !strings.Contains(rollupSums, " AS "+c.Name) {
			t.Errorf("rollupSums lacks %s", c.Name)
		}
	}
}
