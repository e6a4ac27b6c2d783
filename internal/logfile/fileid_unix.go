//go:build unix

package logfile

import (
	"os"
	"syscall"
)

// fileIDOf returns the device and inode of a stat result.
func fileIDOf(fi os.FileInfo) (FileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileID{}, false
	}
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, true //nolint:unconvert // Dev is 32-bit on some platforms
}
