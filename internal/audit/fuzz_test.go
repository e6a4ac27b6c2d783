package audit

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzSkipFast checks skipFast against skip, the validating reference it
// hands failures to, and both against encoding/json: the fast loop
// (skipValue) ends every value where skip does and accepts nothing skip
// refuses, and what encoding/json accepts is skipped whole.
func FuzzSkipFast(f *testing.F) {
	for _, e := range realEvents(f) {
		f.Add(e)
	}
	for _, s := range []string{`{}`, `[]`, ` {"a" : [1, -2.5e+3, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9"]} `,
		`{"a":{"b":{"c":[[],{}]}}}`, `"\ud83d\ude00"`, `01`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `nul`, `-`, `1.`, `1e`,
		`"\q"`, `"\u12"`, `[` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 71), "\"\x01\"", `{"a":"b"}x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref := scanner{s: s}
		refErr := ref.skip()
		fast := scanner{s: s}
		fastErr := fast.skipFast()
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

// FuzzNextRow checks that decoding an EventList body in one pass
// (NextRow) never panics and gives exactly what Next and then Decode
// give, item by item (row fields, dead letters' reasons, read errors),
// read whole and in 7-byte chunks, and that every dead letter says why.
func FuzzNextRow(f *testing.F) {
	ev := realEvents(f)
	f.Add(eventList(ev...))
	f.Add(eventList(ev[0], `{"auditID":"x"}`, `42`, ev[1]))
	f.Add(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"auditID":"a","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48Z","requestObject":{"a":[1,2]}},,{"auditID":"b"}]}`)
	f.Add(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"a":"\q"},{"a":[1}]}`)
	f.Add(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"auditID":"a","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48Z"}`)
	f.Add(`{"kind":"Event"}`)
	f.Fuzz(func(t *testing.T, body string) {
		var two, one, oneChunked strings.Builder
		decodeBody(&two, body, 0, false)
		decodeBody(&one, body, 0, true)
		if one.String() != two.String() {
			t.Fatalf("one pass differs from two:\n%s", firstDiff(one.String(), two.String()))
		}
		// Compared with two passes over the same chunks: the sample a
		// malformed body's dead letter keeps of its rest depends on the
		// reads (it may start one byte earlier when read whole).
		var twoChunked strings.Builder
		decodeBody(&twoChunked, body, 7, false)
		decodeBody(&oneChunked, body, 7, true)
		if oneChunked.String() != twoChunked.String() {
			t.Fatalf("one pass in 7-byte chunks differs from two:\n%s", firstDiff(oneChunked.String(), twoChunked.String()))
		}
		for _, l := range strings.Split(one.String(), "\n") {
			if strings.Contains(l, "dead letter: ;") || strings.HasSuffix(l, "read error: ") {
				t.Fatalf("an error without a reason: %s", l)
			}
		}
	})
}
