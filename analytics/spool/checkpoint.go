package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The checkpoint file holds the confirmed Position in two slots, each in
// its own 4 KiB block: Confirm overwrites the older slot in place and
// fdatasyncs, so a confirm costs one data write and no metadata (no rename,
// no directory fsync, no journal commit that the appends' fsyncs would
// queue behind). A torn write can only damage the slot being written; the
// other still holds the previous position, which replays a little more.
//
//	slot, 36 bytes, little endian:
//	  0  8  magic "SGCKPT02"
//	  8  8  write counter (the slot with the higher counter is current)
//	 16  8  segment
//	 24  8  offset
//	 32  4  CRC32C of bytes 0..32
//
// Spools written before the slots had a 28-byte file replaced by rename
// (magic "SGCKPT01", segment, offset, CRC32C of bytes 0..24); Open reads it
// and rewrites the file in the slot format.
const (
	checkpointName     = "checkpoint"
	checkpointMagic    = "SGCKPT02"
	checkpointSlotSize = 8 + 8 + 8 + 8 + 4
	checkpointSlotGap  = 4096
	checkpointFileSize = checkpointSlotGap + checkpointSlotSize

	legacyCheckpointMagic = "SGCKPT01"
	legacyCheckpointSize  = 8 + 8 + 8 + 4
)

// checkpointState is what readCheckpoint found.
type checkpointState struct {
	pos     Position
	counter uint64 // counter of the current slot; 0 when there is none
	slotted bool   // the file exists in the slot format
}

// readCheckpoint returns the confirmed position, or the zero Position when
// nothing was ever confirmed.
func readCheckpoint(dir string) (checkpointState, error) {
	path := filepath.Join(dir, checkpointName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return checkpointState{}, nil
	}
	if err != nil {
		return checkpointState{}, fmt.Errorf("read spool checkpoint: %w", err)
	}
	bad := &CorruptError{Path: path, Offset: 0, Err: errors.New("bad checkpoint")}
	if len(b) == legacyCheckpointSize && string(b[:8]) == legacyCheckpointMagic {
		// Replaced by rename, so whole or absent: a bad CRC is damage.
		if crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:28]) {
			return checkpointState{}, bad
		}
		return checkpointState{pos: Position{
			Segment: binary.LittleEndian.Uint64(b[8:16]),
			Offset:  int64(binary.LittleEndian.Uint64(b[16:24])),
		}}, nil
	}
	if len(b) != checkpointFileSize {
		return checkpointState{}, bad
	}
	st := checkpointState{slotted: true}
	found := false
	for _, off := range []int{0, checkpointSlotGap} {
		pos, counter, ok := decodeCheckpointSlot(b[off : off+checkpointSlotSize])
		if ok && (!found || counter > st.counter) {
			st.pos, st.counter, found = pos, counter, true
		}
	}
	if !found {
		// Slots are written one at a time, each synced before the other
		// is touched: both bad is damage, not a torn write.
		return checkpointState{}, bad
	}
	return st, nil
}

func encodeCheckpointSlot(pos Position, counter uint64) []byte {
	b := make([]byte, checkpointSlotSize)
	copy(b, checkpointMagic)
	binary.LittleEndian.PutUint64(b[8:16], counter)
	binary.LittleEndian.PutUint64(b[16:24], pos.Segment)
	binary.LittleEndian.PutUint64(b[24:32], uint64(pos.Offset))
	binary.LittleEndian.PutUint32(b[32:36], crc32.Checksum(b[:32], castagnoli))
	return b
}

func decodeCheckpointSlot(b []byte) (Position, uint64, bool) {
	if string(b[:8]) != checkpointMagic || crc32.Checksum(b[:32], castagnoli) != binary.LittleEndian.Uint32(b[32:36]) {
		return Position{}, 0, false
	}
	return Position{
		Segment: binary.LittleEndian.Uint64(b[16:24]),
		Offset:  int64(binary.LittleEndian.Uint64(b[24:32])),
	}, binary.LittleEndian.Uint64(b[8:16]), true
}

// checkpointFile is the open checkpoint, written in place by Confirm.
type checkpointFile struct {
	f       *os.File
	counter uint64 // counter of the current slot
	noSync  bool
}

// openCheckpoint opens the checkpoint for in-place writes, first creating
// it (or converting a legacy one) with a rename when it is not in the slot
// format.
func openCheckpoint(dir string, st checkpointState, noSync bool) (*checkpointFile, error) {
	if !st.slotted {
		if err := writeCheckpoint(dir, st.pos, noSync); err != nil {
			return nil, err
		}
		st.counter = 1
	}
	path := filepath.Join(dir, checkpointName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open spool checkpoint: %w", err)
	}
	return &checkpointFile{f: f, counter: st.counter, noSync: noSync}, nil
}

// write makes pos the checkpoint, durably: it overwrites the older slot.
func (c *checkpointFile) write(pos Position) error {
	counter := c.counter + 1
	off := int64(counter%2) * checkpointSlotGap
	if _, err := c.f.WriteAt(encodeCheckpointSlot(pos, counter), off); err != nil {
		return fmt.Errorf("write spool checkpoint: %w", err)
	}
	if !c.noSync {
		if err := fsyncFile(c.f); err != nil {
			return fmt.Errorf("fsync spool checkpoint: %w", err)
		}
	}
	c.counter = counter
	return nil
}

func (c *checkpointFile) close() error { return c.f.Close() }

// writeCheckpoint replaces the checkpoint file atomically with one holding
// pos in slot 1 (counter 1) and an empty slot 0.
func writeCheckpoint(dir string, pos Position, noSync bool) error {
	b := make([]byte, checkpointFileSize)
	copy(b[checkpointSlotGap:], encodeCheckpointSlot(pos, 1))
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
		if err := fsyncFile(f); err != nil {
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
	if err := fsyncDir(d); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
