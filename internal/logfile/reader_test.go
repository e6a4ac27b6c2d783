package logfile

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// item is what a reader produced, for comparing whole sequences.
type item struct {
	data      string
	off       int64
	noNewline bool
	tooLong   *LineTooLongError
}

func readAll(t testing.TB, r *Reader) []item {
	t.Helper()
	var out []item
	for {
		l, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		var tl *LineTooLongError
		if errors.As(err, &tl) {
			out = append(out, item{tooLong: tl, off: tl.Offset})
			continue
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		out = append(out, item{data: string(l.Data), off: l.Offset, noNewline: l.NoNewline})
	}
}

func gz(t testing.TB, members ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, m := range members {
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestReader(t *testing.T) {
	tests := []struct {
		name    string
		content func(t testing.TB) []byte
		max     int
		want    []item
	}{
		{
			name:    "plain lines come with their offsets",
			content: func(testing.TB) []byte { return []byte("{\"a\":1}\n{\"b\":22}\n") },
			want:    []item{{data: `{"a":1}`, off: 0}, {data: `{"b":22}`, off: 8}},
		},
		{
			name:    "gzip is detected by its magic bytes, offsets are in the decompressed stream",
			content: func(t testing.TB) []byte { return gz(t, "one\ntwo\n") },
			want:    []item{{data: "one", off: 0}, {data: "two", off: 4}},
		},
		{
			name:    "concatenated gzip members read as one stream",
			content: func(t testing.TB) []byte { return gz(t, "one\n", "two\n") },
			want:    []item{{data: "one", off: 0}, {data: "two", off: 4}},
		},
		{
			name:    "a last line without a newline is yielded and marked",
			content: func(testing.TB) []byte { return []byte("a\n{\"torn\":") },
			want:    []item{{data: "a", off: 0}, {data: `{"torn":`, off: 2, noNewline: true}},
		},
		{
			name:    "an empty file yields nothing",
			content: func(testing.TB) []byte { return nil },
			want:    nil,
		},
		{
			name:    "empty lines are yielded as empty",
			content: func(testing.TB) []byte { return []byte("\n\nx\n") },
			want:    []item{{data: "", off: 0}, {data: "", off: 1}, {data: "x", off: 2}},
		},
		{
			name:    "a line longer than the limit is reported with its offset and skipped",
			content: func(testing.TB) []byte { return []byte("short\n" + strings.Repeat("x", 25) + "\nafter\n") },
			max:     10,
			want: []item{
				{data: "short", off: 0},
				{tooLong: &LineTooLongError{Offset: 6, Length: 25, Max: 10}, off: 6},
				{data: "after", off: 32},
			},
		},
		{
			name:    "a line of exactly the limit is yielded",
			content: func(testing.TB) []byte { return []byte("0123456789\n") },
			max:     10,
			want:    []item{{data: "0123456789", off: 0}},
		},
		{
			name:    "a line many buffers long is skipped in pieces",
			content: func(testing.TB) []byte { return []byte("a\n" + strings.Repeat("y", 300000) + "\nb\n") },
			max:     100,
			want: []item{
				{data: "a", off: 0},
				{tooLong: &LineTooLongError{Offset: 2, Length: 300000, Max: 100}, off: 2},
				{data: "b", off: 300003},
			},
		},
		{
			name:    "an overlong last line without a newline is reported",
			content: func(testing.TB) []byte { return []byte("a\n" + strings.Repeat("z", 50)) },
			max:     10,
			want: []item{
				{data: "a", off: 0},
				{tooLong: &LineTooLongError{Offset: 2, Length: 50, Max: 10}, off: 2},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			if err := os.WriteFile(path, tc.content(t), 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := Open(path, ReaderOptions{MaxLineBytes: tc.max})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got := readAll(t, r)
			if size := int64(len(tc.content(t))); r.BytesRead() != size {
				t.Fatalf("BytesRead = %d at the end, want the file size %d", r.BytesRead(), size)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d items %+v, want %d", len(got), got, len(tc.want))
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.data != w.data || g.off != w.off || g.noNewline != w.noNewline ||
					(g.tooLong == nil) != (w.tooLong == nil) || (g.tooLong != nil && *g.tooLong != *w.tooLong) {
					t.Fatalf("item %d = %+v (%v), want %+v (%v)", i, g, g.tooLong, w, w.tooLong)
				}
			}
		})
	}
}

func TestReaderLinesStayValid(t *testing.T) {
	// Lines are kept across many buffer refills; each must keep its bytes.
	var src strings.Builder
	for i := range 20000 {
		src.WriteString(strings.Repeat(string(rune('a'+i%26)), i%300))
		src.WriteByte('\n')
	}
	r, err := NewReader(strings.NewReader(src.String()), ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	for {
		l, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l.Data)
	}
	if len(lines) != 20000 {
		t.Fatalf("%d lines, want 20000", len(lines))
	}
	for i, l := range lines {
		if want := strings.Repeat(string(rune('a'+i%26)), i%300); string(l) != want {
			t.Fatalf("line %d = %.20q..., want %.20q...", i, l, want)
		}
	}
}

func TestReaderReportsDamagedGzip(t *testing.T) {
	b := gz(t, strings.Repeat("line\n", 1000))
	b[len(b)-5] ^= 0xff // the trailer's checksum
	r, err := NewReader(bytes.NewReader(b), ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for range 2000 {
		if _, lastErr = r.Next(); lastErr != nil && !errors.Is(lastErr, ErrLineTooLong) {
			break
		}
	}
	if lastErr == nil || errors.Is(lastErr, io.EOF) {
		t.Fatalf("damaged gzip read to the end: %v", lastErr)
	}
}

// FuzzReader compares the reader with a plain split on newlines.
func FuzzReader(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc"), 2)
	f.Add([]byte("{\"x\":1}\n"), 100)
	f.Add(gz(f, "one\ntwo"), 3)
	f.Add([]byte(strings.Repeat("x", 70000)+"\ny\n"), 65536)
	f.Fuzz(func(t *testing.T, data []byte, max int) {
		if max <= 0 || max > 1<<20 || (len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
			return
		}
		r, err := NewReader(bytes.NewReader(data), ReaderOptions{MaxLineBytes: max})
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, r)
		parts := bytes.Split(data, []byte("\n"))
		if len(parts[len(parts)-1]) == 0 {
			parts = parts[:len(parts)-1] // no unterminated last line
		}
		if len(got) != len(parts) {
			t.Fatalf("%d items, want %d", len(got), len(parts))
		}
		var off int64
		for i, p := range parts {
			g := got[i]
			if g.off != off {
				t.Fatalf("item %d at %d, want %d", i, g.off, off)
			}
			if len(p) > max {
				if g.tooLong == nil || g.tooLong.Length != int64(len(p)) {
					t.Fatalf("item %d: %+v, want too long (%d)", i, g, len(p))
				}
			} else if g.tooLong != nil || g.data != string(p) {
				t.Fatalf("item %d = %+v, want %q", i, g, p)
			}
			off += int64(len(p)) + 1
		}
	})
}
