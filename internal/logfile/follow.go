package logfile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// headBytes is how much of a file's start the checkpoint fingerprints.
const headBytes = 1024

// DefaultPollInterval is how often a Follower looks for new data at the end
// of the file.
const DefaultPollInterval = 250 * time.Millisecond

// FileID identifies a file independent of its name.
type FileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// Checkpoint is a resumable position in a followed log.
type Checkpoint struct {
	FileID
	// Offset is where reading resumes: just after a line.
	Offset int64 `json:"offset"`
	// HeadLen and HeadCRC fingerprint the file's first bytes (CRC32C of
	// min(1 KiB, Offset) bytes), so a recycled inode is not mistaken for the
	// checkpointed file.
	HeadLen int    `json:"head_len"`
	HeadCRC uint32 `json:"head_crc"`
	// Name is the file's name when the checkpoint was taken, for people.
	Name string `json:"name,omitempty"`
}

// FollowOptions configure a Follower.
type FollowOptions struct {
	// CheckpointPath is the file Confirm writes and Follow resumes from.
	// Required. Its directory must exist.
	CheckpointPath string
	// PollInterval defaults to DefaultPollInterval (250 ms) if zero.
	PollInterval time.Duration
	// MaxLineBytes defaults to DefaultMaxLineBytes (16 MiB) if zero.
	MaxLineBytes int
	// Logger receives warnings about truncation and lost files. Defaults
	// to a logger that discards.
	Logger *slog.Logger
}

func (o *FollowOptions) setDefaults() {
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Follower reads a live log file across rotations. Not safe for
// concurrent use.
type Follower struct {
	path string
	opts FollowOptions
	log  *slog.Logger

	cur   *followed // nil until the file exists
	sc    *scanner
	atEOF bool   // the last read of cur hit its end
	after string // name of the last finished backup; newer ones are next
	lost  int64  // bytes known lost to truncations (LostBytes)
}

// followed is one open file.
type followed struct {
	f     *os.File
	id    FileID
	head  []byte // the file's first bytes as last read, up to headBytes
	final bool   // no longer at the path: read to its end, then move on
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Follow starts following the file at path, resuming at the checkpoint in
// opts.CheckpointPath if there is one, else at the start of the file at
// path now (backups already rotated away are not read; ingest them). The
// file need not exist yet. ctx only bounds this call; Next takes its own.
func Follow(ctx context.Context, path string, opts FollowOptions) (*Follower, error) {
	opts.setDefaults()
	if opts.CheckpointPath == "" {
		return nil, errors.New("follow: FollowOptions.CheckpointPath is required")
	}
	fl := &Follower{path: path, opts: opts, log: opts.Logger.With("file", path)}
	cp, ok, err := loadCheckpoint(opts.CheckpointPath)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !ok {
		// Start at the file that is there now; if none is, the first
		// one that appears.
		if _, err := fl.openFresh(path, false); err != nil {
			return nil, err
		}
		return fl, nil
	}
	if err := fl.resume(cp); err != nil {
		fl.Close()
		return nil, err
	}
	return fl, nil
}

// resume opens the checkpointed file, wherever it is now, at its offset.
func (fl *Follower) resume(cp Checkpoint) error {
	st, err := os.Stat(fl.path)
	if err == nil {
		if id, _ := fileIDOf(st); id == cp.FileID {
			ok, err := fl.openAt(fl.path, cp, false)
			if ok || err != nil {
				return err
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stat %s: %w", fl.path, err)
	}
	// Rotated away while we were down: look for the inode in the directory.
	name, err := fl.findByID(cp.FileID)
	if err != nil {
		return err
	}
	if name != "" {
		ok, err := fl.openAt(name, cp, true)
		if ok || err != nil {
			return err
		}
	}
	fl.log.Warn("checkpointed file is gone; starting at the start of the current file, lines in between may be missing",
		"checkpoint", cp.Name, "offset", cp.Offset)
	return nil
}

// openAt opens name if it is the checkpointed file (same id and head) and
// positions the reader at the checkpoint. It reports false if the file is
// not the one.
func (fl *Follower) openAt(name string, cp Checkpoint, final bool) (bool, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return false, fmt.Errorf("stat %s: %w", name, err)
	}
	id, _ := fileIDOf(st)
	head := make([]byte, headBytes)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return false, fmt.Errorf("read %s: %w", name, err)
	}
	head = head[:n]
	if id != cp.FileID || n < cp.HeadLen || crc32.Checksum(head[:cp.HeadLen], castagnoli) != cp.HeadCRC {
		f.Close()
		return false, nil
	}
	off := cp.Offset
	if st.Size() < off {
		fl.log.Warn("file shrank below the checkpoint; reading it from the start", "name", name, "size", st.Size(), "offset", off)
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		f.Close()
		return false, fmt.Errorf("seek %s: %w", name, err)
	}
	fl.use(&followed{f: f, id: id, head: head, final: final}, off)
	return true, nil
}

// use makes fd the current file, read from off.
func (fl *Follower) use(fd *followed, off int64) {
	fl.cur = fd
	fl.atEOF = false
	fl.sc = newScanner(fd.f, fl.opts.MaxLineBytes)
	fl.sc.reset(off)
}

// findByID returns the path of the file in the log's directory with id, or
// "".
func (fl *Follower) findByID(id FileID) (string, error) {
	dir := filepath.Dir(fl.path)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if got, ok := fileIDOf(fi); ok && got == id {
			return filepath.Join(dir, e.Name()), nil
		}
	}
	return "", nil
}

// backupsAfter lists lumberjack backups of the log (stem-TIMESTAMP.ext,
// uncompressed) whose names sort after name, oldest first.
func (fl *Follower) backupsAfter(name string) ([]string, error) {
	dir := filepath.Dir(fl.path)
	base := filepath.Base(fl.path)
	ext := filepath.Ext(base)
	prefix := strings.TrimSuffix(base, ext) + "-"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasPrefix(n, prefix) && strings.HasSuffix(n, ext) &&
			len(n) > len(prefix)+len(ext) && n > filepath.Base(name) {
			out = append(out, filepath.Join(dir, n))
		}
	}
	slices.Sort(out)
	return out, nil
}

// openNext opens the file to read after the current one finished (or the
// path at the start). It leaves cur nil if there is nothing to open yet.
func (fl *Follower) openNext() error {
	if fl.cur != nil {
		done := fl.cur
		fl.cur = nil
		name, err := fl.findByID(done.id)
		done.f.Close()
		if err != nil {
			return err
		}
		if name != "" && name != fl.path {
			fl.after = name
		}
	}
	for {
		// Backups newer than the last finished one were rotated while we
		// read it; they come before the file at the path.
		if fl.after != "" {
			later, err := fl.backupsAfter(fl.after)
			if err != nil {
				return err
			}
			for _, b := range later {
				if ok, err := fl.openFresh(b, true); ok || err != nil {
					return err
				}
			}
		}
		ok, err := fl.openFresh(fl.path, false)
		if !ok || err != nil || fl.after == "" {
			return err
		}
		// A rotation between the listing and the open would make us skip
		// a backup: list again, and start over if one appeared.
		later, err := fl.backupsAfter(fl.after)
		if err != nil || len(later) == 0 {
			return err
		}
		fl.cur.f.Close()
		fl.cur = nil
	}
}

// openFresh opens name at offset 0. A missing file reports false.
func (fl *Follower) openFresh(name string, final bool) (bool, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return false, fmt.Errorf("stat %s: %w", name, err)
	}
	id, ok := fileIDOf(st)
	if !ok {
		f.Close()
		return false, errors.New("follow: no device and inode numbers on this platform")
	}
	fl.use(&followed{f: f, id: id, final: final}, 0)
	return true, nil
}

// Next returns the next complete line, waiting for it as long as ctx
// allows. A *LineTooLongError reports a skipped line; call Next again.
func (fl *Follower) Next(ctx context.Context) (Line, error) {
	for {
		if fl.cur == nil {
			if err := fl.openNext(); err != nil {
				return Line{}, err
			}
			if fl.cur == nil {
				if err := fl.wait(ctx); err != nil {
					return Line{}, err
				}
				continue
			}
		}
		if fl.atEOF && !fl.cur.final {
			// Look before reading on: data read from a file truncated and
			// rewritten since the last look would start mid-line.
			fl.atEOF = false
			if _, err := fl.check(); err != nil {
				return Line{}, err
			}
		}
		l, err := fl.sc.next()
		if err == nil {
			return fl.withCheckpoint(l)
		}
		if !errors.Is(err, io.EOF) {
			if errors.Is(err, ErrLineTooLong) {
				return Line{}, err
			}
			return Line{}, fmt.Errorf("read %s: %w", fl.cur.f.Name(), err)
		}
		if fl.cur.final {
			// A rotated file gets no more writes: a line without its
			// newline stays that way.
			if l, err, ok := fl.sc.final(); ok {
				if err != nil {
					return Line{}, err
				}
				return fl.withCheckpoint(l)
			}
			if err := fl.openNext(); err != nil {
				return Line{}, err
			}
			continue
		}
		fl.atEOF = true
		if err := fl.wait(ctx); err != nil {
			return Line{}, err
		}
	}
}

// check looks at the path and the open file after an EOF: a different (or
// no) file at the path means rotation; a file shorter than what was read,
// or with other first bytes, was truncated. It reports whether either
// happened.
func (fl *Follower) check() (bool, error) {
	st, err := os.Stat(fl.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		fl.cur.final = true // renamed away, not yet recreated
		return true, nil
	case err != nil:
		return false, fmt.Errorf("stat %s: %w", fl.path, err)
	}
	if id, _ := fileIDOf(st); id != fl.cur.id {
		fl.cur.final = true
		return true, nil
	}
	cst, err := fl.cur.f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", fl.cur.f.Name(), err)
	}
	// A file truncated and rewritten past our offset between two looks is
	// caught by its first bytes changing.
	rewritten := false
	if n := len(fl.cur.head); n > 0 {
		head := make([]byte, n)
		got, err := fl.cur.f.ReadAt(head, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, fmt.Errorf("read %s: %w", fl.cur.f.Name(), err)
		}
		rewritten = !bytes.Equal(head[:got], fl.cur.head)
	}
	if rewritten || cst.Size() < fl.sc.consumed() {
		consumed := fl.sc.consumed()
		if copyName, lost := fl.copyOf(consumed); copyName != "" {
			fl.lost += lost
			fl.log.Warn("file truncated in place (copytruncate rotation); reading it again from the start. "+
				"Lines written after the last read were not read from it: they are in the copy (ingest it; what tail stored is deduplicated). "+
				"Lines written between the copy and the truncation are lost. Rotate by renaming to lose nothing.",
				"size", cst.Size(), "offset", consumed, "lostBytes", lost, "copy", copyName)
		} else {
			fl.log.Warn("file truncated in place; reading it again from the start. "+
				"Lines written after the last read and before the truncation are lost; no copy of the file was found to count them. "+
				"Rotate by renaming to lose nothing.",
				"size", cst.Size(), "offset", consumed, "lostBytesUnknown", true)
		}
		if _, err := fl.cur.f.Seek(0, io.SeekStart); err != nil {
			return false, fmt.Errorf("seek %s: %w", fl.cur.f.Name(), err)
		}
		fl.cur.head = nil
		fl.sc.reset(0)
		return true, nil
	}
	return false, nil
}

// copyOf finds the copy a copytruncate rotation made of the current file:
// a sibling whose first bytes are the file's as last read and that is at
// least as long as what was read. It returns the newest such copy and how
// many bytes it holds past the read offset (0, "" if there is none).
func (fl *Follower) copyOf(consumed int64) (string, int64) {
	head := fl.cur.head
	if len(head) == 0 {
		return "", 0
	}
	dir := filepath.Dir(fl.path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", 0
	}
	var best string
	var bestSize int64
	var bestTime time.Time
	buf := make([]byte, len(head))
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == filepath.Base(fl.path) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		n, _ := io.ReadFull(f, buf)
		st, serr := f.Stat()
		f.Close()
		if serr != nil || n < len(head) || !bytes.Equal(buf, head) || st.Size() < consumed {
			continue
		}
		if best == "" || st.ModTime().After(bestTime) {
			best, bestSize, bestTime = name, st.Size(), st.ModTime()
		}
	}
	if best == "" {
		return "", 0
	}
	return best, bestSize - consumed
}

// LostBytes is the number of bytes that truncations of the followed file
// (copytruncate rotations) destroyed before they were read, as far as a
// copy of the file could count them.
func (fl *Follower) LostBytes() int64 { return fl.lost }

// wait sleeps one poll interval.
func (fl *Follower) wait(ctx context.Context) error {
	t := time.NewTimer(fl.opts.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// withCheckpoint sets the line's checkpoint: the current file, the offset after
// the line, and the fingerprint of the file's head.
func (fl *Follower) withCheckpoint(l Line) (Line, error) {
	end := l.Offset + int64(len(l.Data))
	if !l.NoNewline {
		end++
	}
	n := int(min(end, headBytes))
	if len(fl.cur.head) < n {
		head := make([]byte, headBytes)
		got, err := fl.cur.f.ReadAt(head, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return Line{}, fmt.Errorf("read %s: %w", fl.cur.f.Name(), err)
		}
		fl.cur.head = head[:got]
		n = min(n, got)
	}
	l.Checkpoint = Checkpoint{
		FileID:  fl.cur.id,
		Offset:  end,
		HeadLen: n,
		HeadCRC: crc32.Checksum(fl.cur.head[:n], castagnoli),
		Name:    fl.cur.f.Name(),
	}
	return l, nil
}

// Confirm durably records cp (from a Line) as the place to resume. Call it
// only after the lines up to cp are stored.
func (fl *Follower) Confirm(cp Checkpoint) error {
	b, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	return writeFileAtomic(fl.opts.CheckpointPath, append(b, '\n'))
}

// Close releases the open file.
func (fl *Follower) Close() error {
	if fl.cur == nil {
		return nil
	}
	err := fl.cur.f.Close()
	fl.cur = nil
	return err
}

// loadCheckpoint reads the checkpoint file; ok is false when there is none.
func loadCheckpoint(path string) (Checkpoint, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("read checkpoint: %w", err)
	}
	var cp Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return Checkpoint{}, false, fmt.Errorf("decode checkpoint %s: %w", path, err)
	}
	if cp.Offset < 0 || cp.HeadLen < 0 || cp.HeadLen > headBytes {
		return Checkpoint{}, false, fmt.Errorf("decode checkpoint %s: out-of-range fields", path)
	}
	return cp, true, nil
}

// writeFileAtomic replaces path so that a crash leaves the old or the new
// content: write a temporary file, fsync, rename, fsync the directory.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write checkpoint %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync checkpoint %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close checkpoint %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename checkpoint %s: %w", tmp, err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("fsync checkpoint dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync checkpoint dir: %w", err)
	}
	return nil
}
