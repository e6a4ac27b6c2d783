package filereport

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/stampguard/stampguard/analytics/store"
)

// A kept directory holds the engine's data and, beside it, a manifest:
// the files whose events the database holds, each with its size, time of
// change and a hash of its first bytes. The database always holds the
// events of the files given now and of nothing else, so that a report from
// a kept directory equals a report from a new one:
//
//   - a file listed with the same size and time is not read again;
//   - a file that grew (same first bytes, larger) is read again: the
//     events stored before count once, as in any store;
//   - a file not given now, or one whose first bytes changed (a log that
//     rotated in place) or that shrank, holds events the given files may
//     not hold: the database is dropped and every file read again.
//
// The manifest is written after an ingest succeeds, and removed before
// the database is dropped, so it never lists more than the database
// holds. A lock on the directory keeps two reports out of each other's
// way.
const (
	manifestName    = "stampguard-files.json"
	lockName        = "stampguard-report.lock"
	manifestVersion = 1
	// prefixBytes are the first bytes of a file hashed into its identity.
	prefixBytes = 64 << 10
)

type manifest struct {
	Version int         `json:"version"`
	Cluster string      `json:"cluster"`
	Files   []fileEntry `json:"files"`
}

type fileEntry struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"modTimeNs"`
	// Prefix is the hash of the first PrefixLen bytes (prefixBytes, or
	// the whole of a smaller file).
	Prefix    string `json:"prefixSHA256"`
	PrefixLen int64  `json:"prefixLen"`
}

type keep struct {
	dir, cluster string
	lock         *os.File
	now          []fileEntry // the files given, once each
	read         []string    // the paths to read
	reused       []string
	startOver    bool
}

// openKeep locks dir (made when missing) and decides, from its manifest,
// what to read of files.
func openKeep(dir, cluster string, files []string) (*keep, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--keep: %w", err)
	}
	// The lock first: the manifest is read under it.
	k := &keep{dir: dir, cluster: cluster}
	var err error
	if k.lock, err = os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return nil, fmt.Errorf("--keep: %w", err)
	}
	if err := syscall.Flock(int(k.lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		k.lock.Close()
		return nil, fmt.Errorf("--keep %s is in use by another report (%w)", dir, err)
	}
	if err := k.plan(files); err != nil {
		k.unlock()
		return nil, err
	}
	return k, nil
}

// plan reads the manifest and the files, and sets what to read and
// whether to start over.
func (k *keep) plan(files []string) error {
	old, err := readManifest(k.dir)
	if err != nil {
		return err
	}
	if old == nil {
		entries, err := os.ReadDir(k.dir)
		if err != nil {
			return fmt.Errorf("--keep: %w", err)
		}
		for _, e := range entries {
			if e.Name() != lockName {
				return fmt.Errorf("--keep %s is not empty and holds no report's data (no %s): name a new or empty directory", k.dir, manifestName)
			}
		}
	}
	seen := map[string]bool{}
	for _, f := range files {
		e, err := identify(f)
		if err != nil {
			return err
		}
		if !seen[e.Path] {
			seen[e.Path] = true
			k.now = append(k.now, e)
		}
	}
	k.decide(old)
	return nil
}

// decide sets, from the manifest old, what to read and whether to start
// over.
func (k *keep) decide(old *manifest) {
	now := map[string]fileEntry{}
	for _, e := range k.now {
		now[e.Path] = e
	}
	if old != nil {
		k.startOver = old.Version != manifestVersion || old.Cluster != k.cluster
		for _, o := range old.Files {
			n, given := now[o.Path]
			if !given || n.Size < o.Size || !samePrefix(n, o) {
				k.startOver = true
			}
		}
	}
	var had map[string]fileEntry
	if old != nil && !k.startOver {
		had = map[string]fileEntry{}
		for _, o := range old.Files {
			had[o.Path] = o
		}
	}
	for _, e := range k.now {
		if o, ok := had[e.Path]; ok && o == e {
			k.reused = append(k.reused, e.Path)
		} else {
			k.read = append(k.read, e.Path)
		}
	}
}

// samePrefix tells whether n begins with the bytes o began with.
func samePrefix(n, o fileEntry) bool {
	if n.PrefixLen == o.PrefixLen {
		return n.Prefix == o.Prefix
	}
	h, err := hashPrefix(n.Path, o.PrefixLen)
	return err == nil && h == o.Prefix
}

// prepare drops the database when the directory held other files' events,
// and returns the files found unchanged.
func (k *keep) prepare(e store.Engine, log *slog.Logger) ([]string, error) {
	if !k.startOver {
		return k.reused, nil
	}
	log.Info("the kept directory holds events of files not given now, or of files that changed: reading every file again", "dir", k.dir)
	if err := os.Remove(filepath.Join(k.dir, manifestName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := syncDir(k.dir); err != nil {
		return nil, err
	}
	if _, err := e.Query([]byte("DROP DATABASE IF EXISTS "+DefaultDatabase), ""); err != nil {
		return nil, fmt.Errorf("drop the kept database: %w", err)
	}
	return nil, nil
}

func (k *keep) toRead() []string { return k.read }

// commit records the files given as stored.
func (k *keep) commit() error {
	m := manifest{Version: manifestVersion, Cluster: k.cluster, Files: slices.Clone(k.now)}
	slices.SortFunc(m.Files, func(a, b fileEntry) int {
		if a.Path < b.Path {
			return -1
		}
		if a.Path > b.Path {
			return 1
		}
		return 0
	})
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(k.dir, manifestName+".tmp")
	if err := writeSynced(tmp, b); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, manifestName)); err != nil {
		return err
	}
	return syncDir(k.dir)
}

func (k *keep) unlock() {
	if k.lock != nil {
		k.lock.Close() // releases the lock
		k.lock = nil
	}
}

func readManifest(dir string) (*manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--keep: %w", err)
	}
	// A manifest not written by this code, or cut short, is one of an
	// unknown version: the plan starts over.
	m := manifest{Version: -1}
	if json.Valid(b) {
		m = manifest{}
		if err := json.Unmarshal(b, &m); err != nil {
			m = manifest{Version: -1}
		}
	}
	return &m, nil
}

// identify is a file's entry: its absolute path, size, time of change and
// the hash of its first bytes.
func identify(path string) (fileEntry, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fileEntry{}, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return fileEntry{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileEntry{}, err
	}
	if fi.IsDir() {
		return fileEntry{}, fmt.Errorf("%s is a directory, not an audit log file", path)
	}
	n := min(fi.Size(), prefixBytes)
	h, err := hashReader(f, n)
	if err != nil {
		return fileEntry{}, fmt.Errorf("read %s: %w", path, err)
	}
	return fileEntry{Path: abs, Size: fi.Size(), ModTime: fi.ModTime().UnixNano(), Prefix: h, PrefixLen: n}, nil
}

func hashPrefix(path string, n int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return hashReader(f, n)
}

// hashReader hashes the first n bytes of r; fewer is an error.
func hashReader(r io.Reader, n int64) (string, error) {
	h := sha256.New()
	if _, err := io.CopyN(h, r, n); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
