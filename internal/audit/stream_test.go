package audit

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// eventList wraps raw events in an EventList body as the apiserver's webhook
// backend sends it.
func eventList(events ...string) string {
	return `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`
}

// oneByteReader hands out one byte per Read, to exercise buffer refills.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func readAll(t *testing.T, r ItemReader) (items []string, errs []string) {
	t.Helper()
	for {
		it, err := r.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if it.Err != nil {
			errs = append(errs, it.Err.Error())
			continue
		}
		items = append(items, string(it.Raw))
	}
}

func TestListReaderSplitsEventLists(t *testing.T) {
	events := realEvents(t)
	tests := []struct {
		name      string
		body      string
		max       int
		wantItems []string
		wantErrs  int
	}{
		{"an EventList yields its items in order", eventList(events...), 0, events, 0},
		{"an empty EventList yields nothing", eventList(), 0, nil, 0},
		{"keys after items are read too", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[` + events[0] + `],"metadata":{"x":1}}`, 0, events[:1], 0},
		{"whitespace and newlines between items are fine", "{\"kind\":\"EventList\",\"apiVersion\":\"audit.k8s.io/v1\",\n \"items\" : [\n" + events[0] + " ,\n\t" + events[1] + "\n]\n}\n", 0, events[:2], 0},
		{"items null is an empty list", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":null}`, 0, nil, 0},
		{"a non-object item is a dead letter between valid neighbours", eventList(events[0], `"x"`, `[1]`, events[1]), 0, events[:2], 2},
		{"an oversized item is a dead letter and its neighbours survive", eventList(events[2], events[0], events[3]), 1200, []string{events[2], events[3]}, 1},
		{"a truncated body keeps the items before the cut", eventList(events[0], events[1])[:len(eventList(events[0], events[1]))-200], 0, events[:1], 1},
		{"a body that is not an EventList is one dead letter", `hello`, 0, nil, 1},
		{"garbage after the list is a dead letter", eventList(events[0]) + ` x`, 0, events[:1], 1},
		{"braces inside strings do not end an item", eventList(`{"auditID":"a}]\"{["}`), 0, []string{`{"auditID":"a}]\"{["}`}, 0},
		{"an empty body yields nothing", ``, 0, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, slow := range []bool{false, true} {
				var r io.Reader = strings.NewReader(tt.body)
				if slow {
					r = oneByteReader{r}
				}
				items, errs := readAll(t, NewListReader(r, tt.max))
				if strings.Join(items, "\n") != strings.Join(tt.wantItems, "\n") {
					t.Errorf("slow=%v: %d items, want %d", slow, len(items), len(tt.wantItems))
				}
				if len(errs) != tt.wantErrs {
					t.Errorf("slow=%v: dead letters %q, want %d", slow, errs, tt.wantErrs)
				}
			}
		})
	}
}

// TestListReaderRefusesWhatIsNotAnEventList: a body that is JSON but not
// an audit.k8s.io/v1 EventList ends the stream with an *EnvelopeError
// naming the problem, before any item is handed out, so nothing of it is
// stored and the sink can answer 400.
func TestListReaderRefusesWhatIsNotAnEventList(t *testing.T) {
	events := realEvents(t)
	tests := []struct {
		name, body, want string
	}{
		{"a single Event without the wrapper", events[0][:1] + `"kind":"Event","apiVersion":"audit.k8s.io/v1",` + events[0][1:], `kind "Event"`},
		{"a single Event without kind or wrapper", events[0], "a single audit Event"},
		{"another kind", `{"kind":"Pod","apiVersion":"audit.k8s.io/v1","items":[` + events[0] + `]}`, `kind "Pod"`},
		{"kind not a string", `{"kind":7,"apiVersion":"audit.k8s.io/v1","items":[]}`, "kind 7"},
		{"apiVersion v1beta1", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1beta1","items":[` + events[0] + `]}`, "audit.k8s.io/v1beta1"},
		{"another apiVersion", `{"kind":"EventList","apiVersion":"v1","items":[` + events[0] + `]}`, `apiVersion "v1"`},
		{"items an object", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{"a":1}}`, "items is an object"},
		{"items a string", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":"x"}`, "items is a string"},
		{"no items", `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{}}`, "no items"},
		{"items before kind", `{"items":[` + events[0] + `],"kind":"EventList","apiVersion":"audit.k8s.io/v1"}`, "before items"},
		{"no apiVersion", `{"kind":"EventList","items":[` + events[0] + `]}`, "no apiVersion"},
		{"a JSON array of events", `[` + events[0] + `]`, "array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, slow := range []bool{false, true} {
				var r io.Reader = strings.NewReader(tt.body)
				if slow {
					r = oneByteReader{r}
				}
				lr := NewListReader(r, 0)
				it, err := lr.Next()
				var env *EnvelopeError
				if !errors.As(err, &env) {
					t.Fatalf("slow=%v: first Next gave item %q (err %v) and %v, want an EnvelopeError", slow, it.Raw, it.Err, err)
				}
				if !strings.Contains(err.Error(), tt.want) {
					t.Errorf("slow=%v: %q does not name %q", slow, err, tt.want)
				}
				if _, err := lr.Next(); !errors.Is(err, io.EOF) {
					t.Errorf("slow=%v: after the envelope error: %v, want EOF", slow, err)
				}
			}
		})
	}
}

func TestOversizedEventsNameTheirSizeAndTheLimit(t *testing.T) {
	events := realEvents(t)
	want := fmt.Sprintf("event of %d bytes is larger than the limit of 1200 bytes", len(events[0]))
	for name, r := range map[string]ItemReader{
		"EventList": NewListReader(strings.NewReader(eventList(events[2], events[0], events[3])), 1200),
	} {
		_, errs := readAll(t, r)
		if len(errs) != 1 || !strings.Contains(errs[0], want) {
			t.Errorf("%s: dead letters %q, want one saying %q", name, errs, want)
		}
	}
}

func TestListReaderDecompressesGzip(t *testing.T) {
	events := realEvents(t)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte(eventList(events...))); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := MaybeGzip(&buf)
	if err != nil {
		t.Fatal(err)
	}
	items, errs := readAll(t, NewListReader(r, 0))
	if len(items) != len(events) || len(errs) != 0 {
		t.Fatalf("%d items, %d dead letters; want %d, 0", len(items), len(errs), len(events))
	}
}

// FuzzListReader checks that a body encoding/json reads as an EventList
// splits into exactly its items, and that no input panics or loops.
func FuzzListReader(f *testing.F) {
	events := realEvents(f)
	f.Add(eventList(events...))
	f.Add(eventList(events[0], `"x"`, events[1]))
	f.Add(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"a":"}"}],"metadata":{"x":[1,{"y":"]"}]}}`)
	f.Add(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"a":"\\\"}"},{"b":"\\\\"},{"c":["]",{"d":"\\"}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		// A byte at a time takes value's resumable path; the whole body at
		// once takes objectEnd's fast one. Both must split alike.
		for _, r := range []io.Reader{oneByteReader{strings.NewReader(body)}, strings.NewReader(body)} {
			checkSplit(t, body, r)
		}
	})
}

func checkSplit(t *testing.T, body string, r io.Reader) {
	t.Helper()
	var got []string
	var deadLetters int
	lr := NewListReader(r, 1<<20)
	for i := 0; ; i++ {
		if i > len(body)+2 {
			t.Fatalf("more items than bytes in %q", body)
		}
		it, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		var env *EnvelopeError
		if errors.As(err, &env) {
			if len(got) > 0 || deadLetters > 0 {
				t.Fatalf("an envelope error (%v) after %d items of %q", err, len(got)+deadLetters, body)
			}
			return // not a v1 EventList; nothing handed out
		}
		if err != nil {
			t.Fatal(err)
		}
		if it.Err != nil {
			deadLetters++
			continue
		}
		got = append(got, string(it.Raw))
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || !strings.HasPrefix(strings.TrimSpace(body), "{") {
		return
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal([]byte(body), &m)
	if _, exact := m["items"]; !exact {
		return // encoding/json matched the key case-insensitively
	}
	var want []string
	for _, it := range list.Items {
		if bytes.HasPrefix(it, []byte("{")) {
			want = append(want, string(it))
		}
	}
	if deadLetters != len(list.Items)-len(want) || strings.Join(got, "\x00") != strings.Join(want, "\x00") {
		t.Fatalf("split %q (%d dead letters), want %q", got, deadLetters, want)
	}
}

type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

func TestListReaderReportsReadErrorsNotDeadLetters(t *testing.T) {
	events := realEvents(t)
	body := eventList(events...)
	boom := errors.New("connection reset")
	for _, cut := range []int{5, 30, len(body) / 2, len(body) - 3} {
		lr := NewListReader(&failingReader{strings.NewReader(body[:cut]), boom}, 0)
		var err error
		for err == nil {
			var it Item
			it, err = lr.Next()
			if err == nil && it.Err != nil {
				t.Fatalf("cut %d: a read error became a dead letter: %v", cut, it.Err)
			}
		}
		if !errors.Is(err, boom) {
			t.Errorf("cut %d: error %v, want the read error", cut, err)
		}
	}
}

func TestListReaderIsLinearInSmallReads(t *testing.T) {
	// A 4 MB event delivered a byte at a time (a slow client): the bytes
	// the reader copies around must stay proportional to the input.
	big := `{"auditID":"x","pad":"` + strings.Repeat("y", 4<<20) + `"}`
	body := eventList(big, big)
	lr := NewListReader(oneByteReader{strings.NewReader(body)}, 0)
	items, _ := readAll(t, lr)
	if len(items) != 2 {
		t.Fatalf("%d items, want 2", len(items))
	}
	if lr.moved > 4*int64(len(body)) {
		t.Fatalf("copied %d bytes to split %d", lr.moved, len(body))
	}
}

// BenchmarkSplit measures splitting an EventList body of 400 real-shaped
// events into items, per event (no decoding).
func BenchmarkSplit(b *testing.B) {
	events := realEvents(b)
	items := make([]string, 400)
	for i := range items {
		items[i] = events[i%len(events)]
	}
	body := []byte(eventList(items...))
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		lr := NewListReader(bytes.NewReader(body), 0)
		for {
			if _, err := lr.Next(); err != nil {
				break
			}
		}
		lr.Release()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items))/1e3, "µs/event")
}
