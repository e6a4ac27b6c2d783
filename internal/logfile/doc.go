// Package logfile reads kube-apiserver audit log files: the log backend's
// JSON lines, one event per line.
//
// # Whole files
//
// Open reads a file, plain or gzip (detected by its magic bytes, not its
// name), and Reader.Next yields one Line at a time with the byte offset of
// its first byte (in the decompressed stream for gzip). Line.Data belongs to
// the caller. A line longer than ReaderOptions.MaxLineBytes is skipped and
// reported as a *LineTooLongError (errors.Is ErrLineTooLong) carrying its
// offset and length; calling Next again continues after it. BytesRead
// (compressed bytes for gzip) against the file size drives a progress bar. A last line
// without a newline is yielded with NoNewline set: in a finished file it
// is usually a write torn by a crash, and the caller decides.
//
//	r, err := logfile.Open(path, logfile.ReaderOptions{})
//	defer r.Close()
//	for {
//		line, err := r.Next()
//		if errors.Is(err, io.EOF) { break }
//		var tooLong *logfile.LineTooLongError
//		if errors.As(err, &tooLong) { deadLetter(tooLong); continue }
//		if err != nil { return err }
//		handle(line.Data)
//	}
//
// # Live files
//
// Follow follows a live file like `tail -F`. It tracks the file by device
// and inode, so when the apiserver's lumberjack logger rotates it (renames
// audit.log to audit-2006-01-02T15-04-05.000.log and creates a new
// audit.log), the follower first finishes the renamed file and then moves
// on: to backups that sort after it by name (more rotations happened while
// it was not looking), then to the new file. A missing file is waited for;
// a file that shrinks below the read offset, or whose first bytes change,
// was truncated and is read again from its start. Truncation loses data:
// the lines written between the last read and the truncation are never
// read from the file. For a copytruncate rotation the follower finds the
// copy (a sibling with the same first bytes), logs how many bytes it holds
// past the read offset and its name (ingest it to store them), and counts
// them in LostBytes; what was written between the copy and the truncation
// is lost and cannot be counted. Rename rotation (lumberjack, the
// apiserver's own) loses nothing. A line is yielded only once
// its newline is there. Polling, no inotify: the interval bounds the delay.
// Follow reads plain files only: a backup that lumberjack compressed (and
// whose plain file it removed) before the follower got to it is skipped;
// ingest such .gz files with a Reader (the sink deduplicates).
//
// Each Line from a Follower carries a Checkpoint (device, inode, offset
// after the line, and a checksum of the file's first bytes). Confirm writes
// it durably (temporary file, fsync, rename, fsync of the directory); call
// it only after the lines up to it are stored. On a restart Follow resumes
// at the confirmed checkpoint: in the same file if it is still at the
// path, else in the rotated file with that inode (searched in the
// directory), so nothing is lost and nothing is read twice. The checksum of
// the first bytes guards against a recycled inode number.
//
//	f, err := logfile.Follow(ctx, "/var/log/audit.log", logfile.FollowOptions{CheckpointPath: cp})
//	defer f.Close()
//	for {
//		line, err := f.Next(ctx) // blocks; returns ctx's error when done
//		...
//		store(line.Data)
//		err = f.Confirm(line.Checkpoint) // after the store succeeded
//	}
package logfile
