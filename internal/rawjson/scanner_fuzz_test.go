package rawjson

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// FuzzSkipFast checks skipFast against skip, the validating reference it
// hands failures to, and both against encoding/json: the fast loop
// (skipValue) ends every value where skip does and accepts nothing skip
// refuses, and what encoding/json accepts is skipped whole.
func FuzzSkipFast(f *testing.F) {
	if b, err := os.ReadFile("../../analytics/testdata/events.jsonl"); err == nil {
		for _, e := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f.Add(e)
		}
	}
	for _, s := range []string{`{}`, `[]`, ` {"a" : [1, -2.5e+3, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9"]} `,
		`{"a":{"b":{"c":[[],{}]}}}`, `"\ud83d\ude00"`, `01`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `nul`, `-`, `1.`, `1e`,
		`"\q"`, `"\u12"`, `[` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 71), "\"\x01\"", `{"a":"b"}x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref := NewScanner(s)
		refErr := ref.skip()
		fast := NewScanner(s)
		fastErr := fast.SkipFast()
		if (refErr == nil) != (fastErr == nil) || fast.i != ref.i && refErr == nil {
			t.Fatalf("skipFast: end %d, %v; skip: end %d, %v", fast.i, fastErr, ref.i, refErr)
		}
		if refErr != nil && fastErr.Error() != refErr.Error() {
			t.Fatalf("skipFast says %q, skip %q", fastErr, refErr)
		}
		if end, ok := skipValue(s, 0, maxDepth); ok && (refErr != nil || end != ref.i) {
			t.Fatalf("skipValue accepts up to %d, skip: end %d, %v", end, ref.i, refErr)
		}
		// encoding/json refuses raw control characters in strings, which
		// the sink passes through; compare only inputs without them (and
		// so without whitespace other than spaces).
		if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 }) {
			return
		}
		if refErr == nil && !json.Valid([]byte(s[:ref.i])) {
			t.Fatalf("skip accepts %q, encoding/json does not", s[:ref.i])
		}
		if json.Valid([]byte(s)) {
			if want := len(strings.TrimRight(s, " \n\t\r")); fastErr != nil || fast.i != want {
				t.Fatalf("encoding/json accepts %q; skipFast: end %d (want %d), %v", s, fast.i, want, fastErr)
			}
		}
	})
}
