//go:build !linux

package spool

import "os"

// fdatasync is a full fsync where fdatasync is not available.
func fdatasync(f *os.File) error { return f.Sync() }
