package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

const (
	checkpointName  = "checkpoint"
	checkpointMagic = "SGCKPT01"
	checkpointSize  = 8 + 8 + 8 + 4
)

// readCheckpoint returns the confirmed position, or the zero Position when
// nothing was ever confirmed.
func readCheckpoint(dir string) (Position, error) {
	path := filepath.Join(dir, checkpointName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Position{}, nil
	}
	if err != nil {
		return Position{}, fmt.Errorf("read spool checkpoint: %w", err)
	}
	// The file is replaced by rename, so it is whole or absent; anything
	// else is damage that must not be guessed around.
	if len(b) != checkpointSize || string(b[:8]) != checkpointMagic ||
		crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:28]) {
		return Position{}, &CorruptError{Path: path, Offset: 0, Err: errors.New("bad checkpoint")}
	}
	return Position{
		Segment: binary.LittleEndian.Uint64(b[8:16]),
		Offset:  int64(binary.LittleEndian.Uint64(b[16:24])),
	}, nil
}

// writeCheckpoint replaces the checkpoint atomically: write a temporary
// file, fsync it, rename it over the old one, fsync the directory.
func writeCheckpoint(dir string, pos Position, noSync bool) error {
	b := make([]byte, checkpointSize)
	copy(b, checkpointMagic)
	binary.LittleEndian.PutUint64(b[8:16], pos.Segment)
	binary.LittleEndian.PutUint64(b[16:24], uint64(pos.Offset))
	binary.LittleEndian.PutUint32(b[24:28], crc32.Checksum(b[:24], castagnoli))
	return writeFileAtomic(dir, checkpointName, b, noSync)
}

// writeFileAtomic writes name in dir so that a crash leaves the old or the
// new content, never a mix.
func writeFileAtomic(dir, name string, data []byte, noSync bool) error {
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if !noSync {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("fsync %s: %w", tmp, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	if noSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
