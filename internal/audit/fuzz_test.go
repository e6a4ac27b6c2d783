package audit

import (
	"strings"
	"testing"
)

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
