//go:build !unix

package logfile

import "os"

// fileIDOf has no device and inode to offer here; Follow refuses to run.
func fileIDOf(os.FileInfo) (FileID, bool) { return FileID{}, false }
