package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// written is a closed spool with batches appended one per commit group.
type written struct {
	dir     string
	batches [][][]byte
	ends    []Position // end of each batch
}

func (w written) starts(i int) Position {
	if i == 0 || w.ends[i-1].Segment != w.ends[i].Segment {
		return Position{Segment: w.ends[i].Segment, Offset: segmentHeaderSize}
	}
	return w.ends[i-1]
}

func (w written) records(idx ...int) [][]byte {
	var out [][]byte
	for _, i := range idx {
		out = append(out, w.batches[i]...)
	}
	return out
}

func writeBatches(t *testing.T, n int, segBytes int64) written {
	t.Helper()
	w := written{dir: t.TempDir()}
	sp, err := Open(w.dir, Options{SegmentBytes: segBytes})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		recs := batch(fmt.Sprint("b", i), 2, 100)
		w.batches = append(w.batches, recs)
		w.ends = append(w.ends, mustAppend(t, sp, recs))
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	return w
}

func segPathIn(dir string, seq uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d.seg", seq))
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestTornTailIsTruncated(t *testing.T) {
	tests := []struct {
		name string
		tear func(t *testing.T, w written, path string)
		keep []int // batches that survive
	}{
		{
			name: "the last batch cut inside its body keeps the batches before it",
			tear: func(t *testing.T, w written, path string) { must(t, os.Truncate(path, w.ends[2].Offset-10)) },
			keep: []int{0, 1},
		},
		{
			name: "the last batch cut inside its header keeps the batches before it",
			tear: func(t *testing.T, w written, path string) { must(t, os.Truncate(path, w.starts(2).Offset+10)) },
			keep: []int{0, 1},
		},
		{
			name: "zeros after the last batch are dropped",
			tear: func(t *testing.T, w written, path string) { appendBytes(t, path, make([]byte, 4096)) },
			keep: []int{0, 1, 2},
		},
		{
			name: "a bit flip in the last batch's payload drops that batch",
			tear: func(t *testing.T, w written, path string) { flipByte(t, path, w.ends[2].Offset-5) },
			keep: []int{0, 1},
		},
		{
			name: "a torn commit group is dropped whole when a later batch of the same group is intact",
			tear: func(t *testing.T, w written, path string) {
				start := w.ends[2].Offset
				var group []byte
				for i := range 2 {
					recs := batch(fmt.Sprint("g", i), 2, 50)
					b := make([]byte, encodedSize(recs))
					encodeBatch(b, recs)
					setGroupStart(b, start)
					group = append(group, b...)
				}
				group[batchHeaderSize+20] ^= 1 // damage the group's first batch only
				appendBytes(t, path, group)
			},
			keep: []int{0, 1, 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := writeBatches(t, 3, 1<<20)
			path := segPathIn(w.dir, w.ends[0].Segment)
			tc.tear(t, w, path)

			sp := open(t, w.dir, Options{})
			got, _ := drain(t, sp)
			equalRecords(t, got, w.records(tc.keep...))
			wantSize := w.ends[tc.keep[len(tc.keep)-1]].Offset
			if size := fileSize(t, path); size != wantSize {
				t.Fatalf("segment is %d bytes after recovery, want %d", size, wantSize)
			}

			// The spool goes on: new appends, and a second restart sees
			// everything once.
			more := batch("more", 2, 10)
			mustAppend(t, sp, more)
			if err := sp.Close(); err != nil {
				t.Fatal(err)
			}
			sp2 := open(t, w.dir, Options{})
			got, _ = drain(t, sp2)
			equalRecords(t, got, slices.Concat(w.records(tc.keep...), more))
		})
	}
}

func TestCorruptionIsReportedWithFileAndOffset(t *testing.T) {
	tests := []struct {
		name     string
		segBytes int64
		damage   func(t *testing.T, w written) (path string, off int64)
		keep     []int // batches read with SkipCorrupt
	}{
		{
			name:     "a bit flip in a batch followed by later commits of the last segment",
			segBytes: 1 << 20,
			damage: func(t *testing.T, w written) (string, int64) {
				p := segPathIn(w.dir, w.ends[1].Segment)
				flipByte(t, p, w.starts(1).Offset+batchHeaderSize+30)
				return p, w.starts(1).Offset
			},
			keep: []int{0, 2, 3},
		},
		{
			name:     "a bit flip in a batch header followed by later commits",
			segBytes: 1 << 20,
			damage: func(t *testing.T, w written) (string, int64) {
				p := segPathIn(w.dir, w.ends[0].Segment)
				flipByte(t, p, w.starts(0).Offset+9)
				return p, w.starts(0).Offset
			},
			keep: []int{1, 2, 3},
		},
		{
			name:     "a bit flip at the end of a sealed segment",
			segBytes: 600, // about two batches per segment
			damage: func(t *testing.T, w written) (string, int64) {
				// The last batch of the first segment.
				var i int
				for i = 0; w.ends[i+1].Segment == w.ends[0].Segment; i++ {
				}
				p := segPathIn(w.dir, w.ends[i].Segment)
				flipByte(t, p, w.ends[i].Offset-1)
				return p, w.starts(i).Offset
			},
			keep: nil, // filled below: all but the damaged batch
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := writeBatches(t, 4, tc.segBytes)
			path, off := tc.damage(t, w)

			_, err := Open(w.dir, Options{})
			var cerr *CorruptError
			if !errors.As(err, &cerr) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want a *CorruptError", err)
			}
			if cerr.Path != path || cerr.Offset != off {
				t.Fatalf("CorruptError at %s:%d, want %s:%d", cerr.Path, cerr.Offset, path, off)
			}

			sp := open(t, w.dir, Options{SkipCorrupt: true})
			got, _ := drain(t, sp)
			keep := tc.keep
			if keep == nil {
				for i := range w.ends {
					if w.starts(i).Offset != off || segPathIn(w.dir, w.ends[i].Segment) != path {
						keep = append(keep, i)
					}
				}
			}
			equalRecords(t, got, w.records(keep...))
		})
	}
}

func TestRecoveryOfSpoolMetadata(t *testing.T) {
	t.Run("a damaged checkpoint fails Open", func(t *testing.T) {
		w := writeBatches(t, 2, 1<<20)
		if err := os.WriteFile(filepath.Join(w.dir, checkpointName), []byte("garbage"), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(w.dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want ErrCorrupt", err)
		}
	})
	t.Run("a last segment with a torn header is removed", func(t *testing.T) {
		w := writeBatches(t, 2, 1<<20)
		torn := segPathIn(w.dir, w.ends[1].Segment+1)
		if err := os.WriteFile(torn, []byte("SGSP"), 0o640); err != nil {
			t.Fatal(err)
		}
		sp := open(t, w.dir, Options{})
		got, _ := drain(t, sp)
		equalRecords(t, got, w.records(0, 1))
		if _, err := os.Stat(torn); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("torn segment still there: %v", err)
		}
		mustAppend(t, sp, batch("x", 1, 1))
	})
	t.Run("segments left behind a durable checkpoint are removed", func(t *testing.T) {
		w := writeBatches(t, 6, 600)
		sp := open(t, w.dir, Options{SegmentBytes: 600})
		_, end := drain(t, sp)
		if err := writeCheckpoint(w.dir, end, false); err != nil { // as if Confirm crashed before deleting
			t.Fatal(err)
		}
		sp.Close()
		sp2 := open(t, w.dir, Options{})
		if got, _ := drain(t, sp2); len(got) != 0 {
			t.Fatalf("replayed %d confirmed records", len(got))
		}
		for _, f := range segFiles(t, w.dir) {
			if f < segPathIn(w.dir, end.Segment) {
				t.Fatalf("confirmed segment %s not removed", f)
			}
		}
	})
}

func TestDamageFoundWhileReading(t *testing.T) {
	tests := []struct {
		name        string
		skipCorrupt bool
	}{
		{name: "without SkipCorrupt Next reports the file and offset", skipCorrupt: false},
		{name: "with SkipCorrupt Next skips the damaged batch and goes on", skipCorrupt: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sp := open(t, dir, Options{SkipCorrupt: tc.skipCorrupt})
			var ends []Position
			var recs [][][]byte
			for i := range 3 {
				r := batch(fmt.Sprint("b", i), 2, 100)
				recs = append(recs, r)
				ends = append(ends, mustAppend(t, sp, r))
			}
			// Bit rot after the append: the middle batch's payload.
			path := segPathIn(dir, ends[1].Segment)
			flipByte(t, path, ends[1].Offset-3)

			first, err := sp.Next(t.Context(), 1)
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, first.Records, recs[0])
			b, err := sp.Next(t.Context(), 10)
			if !tc.skipCorrupt {
				var cerr *CorruptError
				if !errors.As(err, &cerr) || cerr.Path != path || cerr.Offset != ends[0].Offset {
					t.Fatalf("Next: %v, want a *CorruptError at %s:%d", err, path, ends[0].Offset)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			equalRecords(t, b.Records, recs[2])
			if b.End != ends[2] {
				t.Fatalf("End = %v, want %v", b.End, ends[2])
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
