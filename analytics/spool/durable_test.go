//go:build unix

package spool

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// diskModel records what the spool's fsync calls made durable, the way a
// power loss would see it: for a file, the size it had when it was last
// synced (segments and the checkpoint only grow or are overwritten in
// place, so that prefix is what survives); for a directory, the entries
// it held when it was synced.
// Files are known by inode: a file fsynced under a temporary name and then
// renamed keeps what it made durable.
type diskModel struct {
	mu      sync.Mutex
	size    map[uint64]int64  // inode → size at its last fsync
	syncs   map[uint64]int    // inode → fsyncs so far
	entries map[string]uint64 // path → the inode its fsynced directory entry names
}

func inode(fi os.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }

// recordDurability replaces fsyncFile and fsyncDir, for the test, with
// the real calls followed by a note of what they made durable.
func recordDurability(t *testing.T) *diskModel {
	m := &diskModel{size: map[uint64]int64{}, syncs: map[uint64]int{}, entries: map[string]uint64{}}
	file, dir := fsyncFile, fsyncDir
	t.Cleanup(func() { fsyncFile, fsyncDir = file, dir })
	fsyncFile = func(f *os.File) error {
		if err := file(f); err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.size[inode(fi)] = max(m.size[inode(fi)], fi.Size())
		m.syncs[inode(fi)]++
		return nil
	}
	fsyncDir = func(d *os.File) error {
		if err := dir(d); err != nil {
			return err
		}
		des, err := os.ReadDir(d.Name())
		if err != nil {
			return err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, de := range des {
			if fi, err := de.Info(); err == nil {
				m.entries[filepath.Join(d.Name(), de.Name())] = inode(fi)
			}
		}
		return nil
	}
	return m
}

// durable says whether the first n bytes of path survive a power loss,
// and if not, what does.
func (m *diskModel) durable(path string, n int64) (bool, string) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, err.Error()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ino, ok := m.entries[path]
	switch {
	case !ok || ino != inode(fi):
		return false, "its directory entry was never fsynced"
	case m.size[ino] < n:
		return false, fmt.Sprintf("it was fsynced to %d bytes", m.size[ino])
	}
	return true, ""
}

func (m *diskModel) syncsOf(path string) int {
	fi, err := os.Stat(path)
	if err != nil {
		return -1
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs[inode(fi)]
}

// crashImage copies dir as a power loss would leave it: only files whose
// directory entry was fsynced, each cut to the size of its last fsync.
func (m *diskModel) crashImage(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, de := range des {
		path := filepath.Join(dir, de.Name())
		fi, err := de.Info()
		if err != nil {
			t.Fatal(err)
		}
		if ino, ok := m.entries[path]; !ok || ino != inode(fi) || de.IsDir() {
			continue
		}
		src, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := os.Create(filepath.Join(out, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(dst, io.LimitReader(src, m.size[inode(fi)])); err != nil {
			t.Fatal(err)
		}
		src.Close()
		if err := dst.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestAppendReturnsOnlyWhatIsOnDisk checks the promise behind the sink's
// 200: when Append returns a position, the segment holding it was fsynced
// at least that far and its directory entry was fsynced too; when Confirm
// returns, the checkpoint was fsynced after it was written. Concurrent
// appenders share commits, and small segments make the spool roll many
// times. Finally the spool is read back from the image a power loss would
// leave at that moment: every acknowledged record is in it. A spool whose
// fsyncs were dropped (sync or syncDir doing nothing) fails here.
func TestAppendReturnsOnlyWhatIsOnDisk(t *testing.T) {
	m := recordDurability(t)
	dir := t.TempDir()
	sp, err := Open(dir, Options{SegmentBytes: 8 << 10, MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	checkpoint := filepath.Join(dir, checkpointName)
	if ok, why := m.durable(checkpoint, checkpointFileSize); !ok {
		t.Fatalf("Open returned with a checkpoint file not on disk: %s", why)
	}

	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	const writers, appends = 4, 60
	var (
		mu    sync.Mutex
		acked = map[string]bool{}
		wg    sync.WaitGroup
	)
	for w := range writers {
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
		wg.Go(func() {
			for i := range appends {
				var recs [][]byte
				var names []string
				for j := range 1 + rng.IntN(4) {
					name := fmt.Sprintf("w%d-a%d-r%d", w, i, j)
					names = append(names, name)
					recs = append(recs, []byte(name+" "+strings.Repeat("x", rng.IntN(900))))
				}
				pos, err := sp.Append(recs)
				if err != nil {
					t.Errorf("append: %v", err)
					return
				}
				if ok, why := m.durable(sp.segPath(pos.Segment), pos.Offset); !ok {
					t.Errorf("Append returned %s, but %s", pos, why)
				}
				mu.Lock()
				for _, n := range names {
					acked[n] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if st := sp.Stats(); st.Segments < 3 {
		t.Fatalf("%d segments: the test must roll segments", st.Segments)
	}

	// A power loss now: the image holds every acknowledged record.
	img := m.crashImage(t, dir)
	readAll := func(dir string) map[string]bool {
		t.Helper()
		re, err := Open(dir, Options{NoSync: true})
		if err != nil {
			t.Fatalf("open the image of a power loss: %v", err)
		}
		defer re.Close()
		got := map[string]bool{}
		for re.Stats().RecordsPending > int64(len(got)) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			b, err := re.Next(ctx, 1000)
			cancel()
			if err != nil {
				t.Fatalf("read the image back: %v (%d records read)", err, len(got))
			}
			for _, r := range b.Records {
				name, _, _ := strings.Cut(string(r), " ")
				got[name] = true
			}
		}
		return got
	}
	got := readAll(img)
	for n := range acked {
		if !got[n] {
			t.Errorf("acknowledged record %s is not in the image a power loss leaves", n)
		}
	}
	t.Logf("%d records acknowledged, %d in the power-loss image", len(acked), len(got))

	// Confirm: the checkpoint is on disk before Confirm returns.
	for range 3 {
		b, err := sp.Next(t.Context(), 50)
		if err != nil {
			t.Fatal(err)
		}
		before := m.syncsOf(checkpoint)
		if err := sp.Confirm(b.End); err != nil {
			t.Fatal(err)
		}
		if after := m.syncsOf(checkpoint); after <= before {
			t.Errorf("Confirm(%s) returned without an fsync of the checkpoint", b.End)
		}
	}
}
