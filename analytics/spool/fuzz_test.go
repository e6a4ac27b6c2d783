package spool

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"testing"
)

func encoded(groupStart int64, recs ...string) []byte {
	rs := make([][]byte, len(recs))
	for i, r := range recs {
		rs[i] = []byte(r)
	}
	b := make([]byte, encodedSize(rs))
	encodeBatch(b, rs)
	setGroupStart(b, groupStart)
	return b
}

func fuzzSeeds(f *testing.F) {
	one := encoded(16, "hello", "", "world")
	two := append(encoded(16, "a"), encoded(16, "bb", "ccc")...)
	flipped := bytes.Clone(two)
	flipped[batchHeaderSize+9] ^= 1
	f.Add([]byte{})
	f.Add(one)
	f.Add(two)
	f.Add(flipped)
	f.Add(one[:len(one)-1])
	f.Add(append([]byte("SGB1"), make([]byte, 40)...))
	f.Add(append(bytes.Repeat([]byte{0}, 7), one...))
}

// FuzzDecodeBatch checks the segment decoder on arbitrary bytes: no
// panic, and whatever decodes re-encodes to the same bytes.
func FuzzDecodeBatch(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		bh, recs, n, err := decodeBatch(data)
		if err == nil {
			if int(n) > len(data) || len(recs) != bh.count {
				t.Fatalf("decoded %d records in %d bytes from %d", len(recs), n, len(data))
			}
			again := make([]byte, encodedSize(recs))
			encodeBatch(again, recs)
			setGroupStart(again, bh.groupStart)
			if !bytes.Equal(again, data[:n]) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, data[:n])
			}
		} else if !errors.Is(err, errBadBatch) {
			t.Fatalf("error not marked as a bad batch: %v", err)
		}
		if at, _ := nextIntact(data, 0); at >= 0 {
			if _, _, _, err := decodeBatch(data[at:]); err != nil {
				t.Fatalf("nextIntact found %d, which does not decode: %v", at, err)
			}
		}
		tornTail(data, 0)
	})
}

// FuzzOpenSegment writes arbitrary bytes as the body of the only segment
// and opens the spool: recovery must not panic, and with SkipCorrupt every
// batch it keeps must read back.
func FuzzOpenSegment(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		seg := append(encodeSegmentHeader(1), data...)
		if err := os.WriteFile(segPathIn(dir, 1), seg, 0o640); err != nil {
			t.Fatal(err)
		}
		opts := Options{NoSync: true, SkipCorrupt: true, Logger: slog.New(slog.DiscardHandler)}
		sp, err := Open(dir, opts)
		if err != nil {
			t.Fatalf("Open with SkipCorrupt: %v", err)
		}
		defer sp.Close()
		want := sp.Stats().RecordsPending
		got, _ := drain(t, sp)
		if int64(len(got)) != want {
			t.Fatalf("read %d records, Stats said %d pending", len(got), want)
		}
	})
}
