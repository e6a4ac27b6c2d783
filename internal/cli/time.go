package cli

import (
	"fmt"
	"strings"
	"time"
)

// ParseTime reads a window bound given on a command line (`--since`,
// `--until` of `auditsink report` and `webhook replay`): RFC3339, or a
// duration meaning that long before now ("2h", "30m", "7d").
func ParseTime(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		var days int
		if _, err := fmt.Sscanf(d, "%d", &days); err == nil && days >= 0 && fmt.Sprint(days) == d {
			return now.Add(-time.Duration(days) * 24 * time.Hour), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("time %q: want RFC3339 (2026-11-29T08:00:00Z) or a duration ago (2h, 30m, 7d)", s)
	}
	return now.Add(-d), nil
}
