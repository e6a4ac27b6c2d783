package spool

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data and the metadata needed to read it back (its
// size, its blocks), but not timestamps: an overwrite in place then needs
// no journal commit.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}
