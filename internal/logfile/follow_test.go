package logfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// logDir is a directory with an audit.log written the way the apiserver's
// lumberjack logger does it.
type logDir struct {
	t    *testing.T
	dir  string
	path string
	cp   string
	n    int // lines written so far, named line-1, line-2, ...
	rot  int // rotations so far
}

func newLogDir(t *testing.T) *logDir {
	dir := t.TempDir()
	return &logDir{t: t, dir: dir, path: filepath.Join(dir, "audit.log"), cp: filepath.Join(t.TempDir(), "tail.checkpoint")}
}

// write appends n numbered lines to the file at the path.
func (d *logDir) write(n int) {
	d.t.Helper()
	var b strings.Builder
	for range n {
		d.n++
		fmt.Fprintf(&b, "{\"line\":%d}\n", d.n)
	}
	d.writeRaw(b.String())
}

func (d *logDir) writeRaw(s string) {
	d.t.Helper()
	f, err := os.OpenFile(d.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		d.t.Fatal(err)
	}
}

// rotate renames the file to a lumberjack backup name; the next write
// creates a new file.
func (d *logDir) rotate() string {
	d.t.Helper()
	d.rot++
	backup := filepath.Join(d.dir, fmt.Sprintf("audit-2026-11-29T09-00-%02d.000.log", d.rot))
	if err := os.Rename(d.path, backup); err != nil {
		d.t.Fatal(err)
	}
	return backup
}

func (d *logDir) follow() *Follower {
	d.t.Helper()
	f, err := Follow(d.t.Context(), d.path, FollowOptions{
		CheckpointPath: d.cp,
		PollInterval:   time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(testLog{d.t}, nil)),
	})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { f.Close() })
	return f
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// next reads one line, waiting for it.
func next(t *testing.T, f *Follower) Line {
	t.Helper()
	l, err := f.Next(t.Context())
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return l
}

// expect reads lines and checks they are line-from..line-to in order.
func expect(t *testing.T, f *Follower, from, to int) Line {
	t.Helper()
	var l Line
	for i := from; i <= to; i++ {
		l = next(t, f)
		if want := fmt.Sprintf("{\"line\":%d}", i); string(l.Data) != want {
			t.Fatalf("got %q, want %q", l.Data, want)
		}
	}
	return l
}

// expectNothing checks that no complete line is there now: a done context
// makes Next look once instead of waiting.
func expectNothing(t *testing.T, f *Follower) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if l, err := f.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next = %q, %v; want nothing yet", l.Data, err)
	}
}

func TestFollowYieldsOnlyCompleteLines(t *testing.T) {
	d := newLogDir(t)
	d.write(2)
	d.writeRaw(`{"line":`)
	f := d.follow()
	expect(t, f, 1, 2)
	expectNothing(t, f)
	d.writeRaw("3}\n")
	l := expect(t, f, 3, 3)
	if l.Offset != 22 || l.Checkpoint.Offset != 33 {
		t.Fatalf("line 3 at %d, checkpoint %d; want 22 and 33", l.Offset, l.Checkpoint.Offset)
	}
}

func TestFollowWaitsForTheFileToAppear(t *testing.T) {
	d := newLogDir(t)
	f := d.follow()
	expectNothing(t, f)
	d.write(2)
	expect(t, f, 1, 2)
}

func TestFollowAcrossRotation(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, d *logDir, f *Follower)
	}{
		{
			name: "the renamed file is finished before the new one, lines written just before the rename included",
			run: func(t *testing.T, d *logDir, f *Follower) {
				d.write(5)
				expect(t, f, 1, 3)
				d.write(2) // lands in the old file, not yet read
				d.rotate()
				d.write(3) // the new file
				expect(t, f, 4, 10)
				expectNothing(t, f)
			},
		},
		{
			name: "rotation seen while idle at the end of the file",
			run: func(t *testing.T, d *logDir, f *Follower) {
				d.write(3)
				expect(t, f, 1, 3)
				expectNothing(t, f)
				d.rotate()
				expectNothing(t, f) // no file at the path for a moment
				d.write(2)
				expect(t, f, 4, 5)
			},
		},
		{
			name: "several rotations between two reads are read in order",
			run: func(t *testing.T, d *logDir, f *Follower) {
				d.write(2)
				expect(t, f, 1, 1)
				d.rotate()
				d.write(2)
				d.rotate()
				d.write(2)
				d.rotate()
				d.write(2)
				expect(t, f, 2, 8)
				expectNothing(t, f)
			},
		},
		{
			name: "a partial last line in a rotated file is yielded as such",
			run: func(t *testing.T, d *logDir, f *Follower) {
				d.write(1)
				d.writeRaw(`{"torn"`)
				expect(t, f, 1, 1)
				d.rotate()
				d.write(1)
				l := next(t, f)
				if string(l.Data) != `{"torn"` || !l.NoNewline {
					t.Fatalf("got %q (NoNewline %v), want the torn line", l.Data, l.NoNewline)
				}
				expect(t, f, 2, 2)
			},
		},
		{
			name: "a truncated file is read again from its start",
			run: func(t *testing.T, d *logDir, f *Follower) {
				d.write(3)
				expect(t, f, 1, 3)
				if err := os.Truncate(d.path, 0); err != nil {
					t.Fatal(err)
				}
				d.write(1)
				expect(t, f, 4, 4)
			},
		},
		{
			name: "a file truncated and rewritten past the read offset is read from its start, not mid-line",
			run: func(t *testing.T, d *logDir, f *Follower) {
				d.write(3)
				expect(t, f, 1, 3)
				expectNothing(t, f)
				if err := os.Truncate(d.path, 0); err != nil {
					t.Fatal(err)
				}
				long := `{"line":4,"pad":"` + strings.Repeat("p", 60) + `"}`
				d.writeRaw(long + "\n")
				if l := next(t, f); string(l.Data) != long {
					t.Fatalf("got %q, want the whole rewritten line", l.Data)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newLogDir(t)
			tc.run(t, d, d.follow())
		})
	}
}

func TestFollowResumesFromCheckpoint(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, d *logDir)
	}{
		{
			name: "a restart resumes after the confirmed line of the same file",
			run: func(t *testing.T, d *logDir) {
				d.write(5)
				f := d.follow()
				l := expect(t, f, 1, 3)
				if err := f.Confirm(l.Checkpoint); err != nil {
					t.Fatal(err)
				}
				expect(t, f, 4, 5) // read but never confirmed
				f.Close()
				d.write(1)
				expect(t, d.follow(), 4, 6)
			},
		},
		{
			name: "a restart after a rotation finishes the rotated file first",
			run: func(t *testing.T, d *logDir) {
				d.write(5)
				f := d.follow()
				l := expect(t, f, 1, 2)
				if err := f.Confirm(l.Checkpoint); err != nil {
					t.Fatal(err)
				}
				f.Close()
				d.rotate()
				d.write(2)
				d.rotate()
				d.write(2)
				f2 := d.follow()
				expect(t, f2, 3, 9)
				expectNothing(t, f2)
			},
		},
		{
			name: "a checkpoint at the very end of a rotated file moves on to the new file",
			run: func(t *testing.T, d *logDir) {
				d.write(2)
				f := d.follow()
				l := expect(t, f, 1, 2)
				if err := f.Confirm(l.Checkpoint); err != nil {
					t.Fatal(err)
				}
				f.Close()
				d.rotate()
				d.write(2)
				expect(t, d.follow(), 3, 4)
			},
		},
		{
			name: "a checkpoint whose file is gone starts the current file from the start",
			run: func(t *testing.T, d *logDir) {
				d.write(3)
				f := d.follow()
				l := expect(t, f, 1, 2)
				if err := f.Confirm(l.Checkpoint); err != nil {
					t.Fatal(err)
				}
				f.Close()
				if err := os.Remove(d.rotate()); err != nil {
					t.Fatal(err)
				}
				d.write(2)
				expect(t, d.follow(), 4, 5)
			},
		},
		{
			name: "a checkpoint whose head fingerprint differs is not trusted",
			run: func(t *testing.T, d *logDir) {
				d.write(3)
				f := d.follow()
				l := expect(t, f, 1, 2)
				cp := l.Checkpoint
				cp.HeadCRC++ // as if the inode had been recycled for another file
				if err := f.Confirm(cp); err != nil {
					t.Fatal(err)
				}
				f.Close()
				expect(t, d.follow(), 1, 3)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newLogDir(t))
		})
	}
}

func TestFollowNeedsACheckpointPath(t *testing.T) {
	if _, err := Follow(t.Context(), "x", FollowOptions{}); err == nil {
		t.Fatal("Follow without CheckpointPath succeeded")
	}
}

func TestFollowAConcurrentWriterThatRotates(t *testing.T) {
	// A writer like lumberjack (split writes, rename and create every 300
	// lines) runs while the follower reads; halfway the follower restarts
	// from its checkpoint. Every line must arrive once, in order.
	d := newLogDir(t)
	const total = 3000
	d.write(1)
	f := d.follow() // holds the first file before the writer runs
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(d.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			done <- err
			return
		}
		for i := 2; i <= total; i++ {
			line := fmt.Sprintf("{\"line\":%d}\n", i)
			half := len(line) / 2
			if _, err := f.WriteString(line[:half]); err != nil {
				done <- err
				return
			}
			if _, err := f.WriteString(line[half:]); err != nil {
				done <- err
				return
			}
			if i%300 == 0 {
				f.Close()
				backup := filepath.Join(d.dir, fmt.Sprintf("audit-2026-11-29T09-00-00.%03d.log", i/300))
				if err := os.Rename(d.path, backup); err != nil {
					done <- err
					return
				}
				if f, err = os.OpenFile(d.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
					done <- err
					return
				}
			}
		}
		done <- f.Close()
	}()

	for i := 1; i <= total; i++ {
		l := next(t, f)
		if want := fmt.Sprintf("{\"line\":%d}", i); string(l.Data) != want {
			t.Fatalf("got %q, want %q", l.Data, want)
		}
		if i == total/2 {
			if err := f.Confirm(l.Checkpoint); err != nil {
				t.Fatal(err)
			}
			f.Close()
			f = d.follow()
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	expectNothing(t, f)
}

// copytruncate rotates the way logrotate's copytruncate does: copy the
// file's bytes to a backup, then truncate the file in place.
func (d *logDir) copytruncate() string {
	d.t.Helper()
	b, err := os.ReadFile(d.path)
	if err != nil {
		d.t.Fatal(err)
	}
	backup := d.path + ".1"
	if err := os.WriteFile(backup, b, 0o600); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Truncate(d.path, 0); err != nil {
		d.t.Fatal(err)
	}
	return backup
}

// TestFollowReportsWhatCopytruncateLost: lines written after the last read
// and before a copytruncate rotation are not read from the truncated file;
// the follower counts their bytes, names the copy holding them, and goes
// on with the new lines.
func TestFollowReportsWhatCopytruncateLost(t *testing.T) {
	d := newLogDir(t)
	var logs bytes.Buffer
	f, err := Follow(t.Context(), d.path, FollowOptions{CheckpointPath: d.cp, PollInterval: time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d.write(5)
	expect(t, f, 1, 5)
	expectNothing(t, f)
	before, _ := os.Stat(d.path)
	d.write(99) // written, never read: the rotation comes first
	after, _ := os.Stat(d.path)
	lost := after.Size() - before.Size()
	backup := d.copytruncate()
	d.write(1)
	expect(t, f, 105, 105)
	if got := f.LostBytes(); got != lost {
		t.Errorf("LostBytes() = %d, want the %d bytes of the 99 unread lines", got, lost)
	}
	out := logs.String()
	for _, want := range []string{`"lostBytes":` + fmt.Sprint(lost), `"copy":"` + backup + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the truncation warning lacks %s:\n%s", want, out)
		}
	}
}
