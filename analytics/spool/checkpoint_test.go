package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// confirmAll drains sp and confirms each batch on its own, returning the
// positions confirmed in order.
func confirmAll(t *testing.T, sp *Spool) []Position {
	t.Helper()
	var ends []Position
	for sp.Stats().RecordsPending > 0 {
		b, err := sp.Next(t.Context(), 1)
		if err != nil {
			t.Fatal(err)
		}
		must(t, sp.Confirm(b.End))
		ends = append(ends, b.End)
	}
	return ends
}

func TestCheckpoint(t *testing.T) {
	t.Run("Confirm overwrites the checkpoint in place instead of replacing it", func(t *testing.T) {
		w := writeBatches(t, 4, 1<<20)
		sp := open(t, w.dir, Options{})
		path := filepath.Join(w.dir, checkpointName)
		before, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		confirmAll(t, sp)
		after, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(before, after) {
			t.Fatal("the checkpoint file was replaced: Confirm pays a rename and a directory fsync")
		}
		if after.Size() != checkpointFileSize {
			t.Fatalf("checkpoint size %d, want %d", after.Size(), checkpointFileSize)
		}
		if st, ok := before.Sys().(*syscall.Stat_t); ok && st.Nlink != 1 {
			t.Fatalf("checkpoint has %d links", st.Nlink)
		}
	})
	t.Run("a torn write of the current slot falls back to the previous position", func(t *testing.T) {
		// A crash while the last Confirm wrote its slot: the segment,
		// which that Confirm deletes once the slot is durable, is still
		// there. Keep a copy of it and put it back after the Close.
		w := written{dir: t.TempDir()}
		sp := open(t, w.dir, Options{})
		for i := range 3 {
			w.batches = append(w.batches, batch(fmt.Sprint("b", i), 2, 100))
			w.ends = append(w.ends, mustAppend(t, sp, w.batches[i]))
		}
		var ends []Position
		var seg string
		var kept []byte
		for i := range 3 {
			b, err := sp.Next(t.Context(), 1)
			if err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				seg = segFiles(t, w.dir)[0]
				if kept, err = os.ReadFile(seg); err != nil {
					t.Fatal(err)
				}
			}
			must(t, sp.Confirm(b.End))
			ends = append(ends, b.End)
		}
		must(t, sp.Close())
		if err := os.WriteFile(seg, kept, 0o640); err != nil {
			t.Fatal(err)
		}
		// The last Confirm wrote the slot of its counter; tear it.
		st, err := readCheckpoint(w.dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.pos != ends[2] {
			t.Fatalf("checkpoint %v, want %v", st.pos, ends[2])
		}
		flipByte(t, filepath.Join(w.dir, checkpointName), int64(st.counter%2)*checkpointSlotGap+20)
		sp2 := open(t, w.dir, Options{})
		got, _ := drain(t, sp2)
		equalRecords(t, got, w.records(2)) // replayed, not lost
		// And Confirm goes on writing over the torn slot.
		b := mustAppend(t, sp2, batch("x", 1, 10))
		next, err := sp2.Next(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if next.End != b {
			t.Fatalf("Next ends at %v, want %v", next.End, b)
		}
		must(t, sp2.Confirm(b))
		must(t, sp2.Close())
		sp3 := open(t, w.dir, Options{})
		if got, _ := drain(t, sp3); len(got) != 0 {
			t.Fatalf("replayed %d confirmed records", len(got))
		}
	})
	t.Run("both slots damaged fails Open", func(t *testing.T) {
		w := writeBatches(t, 2, 1<<20)
		sp := open(t, w.dir, Options{})
		confirmAll(t, sp)
		must(t, sp.Close())
		path := filepath.Join(w.dir, checkpointName)
		flipByte(t, path, 20)
		flipByte(t, path, checkpointSlotGap+20)
		if _, err := Open(w.dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want ErrCorrupt", err)
		}
	})
	t.Run("a checkpoint of the earlier rename format is read and converted", func(t *testing.T) {
		w := writeBatches(t, 3, 1<<20)
		b := make([]byte, legacyCheckpointSize)
		copy(b, legacyCheckpointMagic)
		binary.LittleEndian.PutUint64(b[8:16], w.ends[0].Segment)
		binary.LittleEndian.PutUint64(b[16:24], uint64(w.ends[0].Offset))
		binary.LittleEndian.PutUint32(b[24:28], crc32.Checksum(b[:24], castagnoli))
		must(t, os.WriteFile(filepath.Join(w.dir, checkpointName), b, 0o640))
		sp := open(t, w.dir, Options{})
		got, _ := drain(t, sp)
		equalRecords(t, got, w.records(1, 2))
		st, err := readCheckpoint(w.dir)
		if err != nil || !st.slotted || st.pos != w.ends[0] {
			t.Fatalf("after Open: checkpoint %+v, %v; want %v in the slot format", st, err, w.ends[0])
		}
	})
	t.Run("a damaged checkpoint of the earlier format fails Open", func(t *testing.T) {
		w := writeBatches(t, 1, 1<<20)
		b := make([]byte, legacyCheckpointSize)
		copy(b, legacyCheckpointMagic)
		must(t, os.WriteFile(filepath.Join(w.dir, checkpointName), b, 0o640))
		if _, err := Open(w.dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want ErrCorrupt", err)
		}
	})
}
