// Package spool is a durable write-ahead spool of opaque records.
//
// The audit sink appends each accepted batch of events here before it
// answers the apiserver, and a background drainer empties the spool into
// ClickHouse. Nothing acknowledged is lost: Append returns only after the
// batch is written and fsynced, and a restart replays every batch that was
// not confirmed.
//
// # Use
//
//	sp, err := spool.Open(dir, spool.Options{MaxBytes: 2 << 30, Logger: log})
//	...
//	// HTTP handlers, concurrently:
//	if _, err := sp.Append(records); errors.Is(err, spool.ErrFull) {
//		// answer 503 with Retry-After
//	}
//	// one background drainer:
//	for {
//		b, err := sp.Next(ctx, 10000) // blocks until at least one batch
//		...store b.Records downstream...
//		err = sp.Confirm(b.End) // durable; fully confirmed segments are deleted
//	}
//
// Concurrent appends share one write and one fsync (group commit). There is
// one reader: Next and Confirm must not be called concurrently with
// each other (they are serialised, but interleaving them from several
// goroutines makes no sense). Next returns whole appended batches, in append
// order, at least one per call.
//
// # On disk
//
// The directory holds segment files named by a 20-digit decimal sequence
// number ("00000000000000000001.seg"), a checkpoint file ("checkpoint")
// that holds the confirmed Position, and a "lock" file: an open Spool holds
// an flock on it, so a second Open of the directory fails with ErrInUse.
// The checkpoint has two checksummed slots that Confirm overwrites in turn
// and fdatasyncs (see checkpoint.go), so a confirm renames nothing and
// costs the appends no extra journal commit.
// A segment starts with a 16-byte header
// (magic "SGSPOOL1", segment number, big endian) followed by batches:
//
//	batch header, 24 bytes, little endian:
//	  0  4  magic "SGB1"
//	  4  4  CRC32C (Castagnoli) of bytes 8..24
//	  8  4  number of records
//	 12  4  body length in bytes (the record frames that follow)
//	 16  8  offset in this segment where the batch's commit group starts
//	record frame:
//	  0  4  CRC32C of bytes 4..8+length (the length and the payload)
//	  4  4  payload length
//	  8  n  payload
//
// Segments roll over at Options.SegmentBytes; a batch is never split, so a
// segment holding one large batch may be larger. A Confirm that covers all
// of the segment being written while no append is being committed deletes
// it too, so a drained spool holds no confirmed bytes against MaxBytes. A new segment is created on
// the first Append after Open, and segment creation fsyncs the directory.
//
// # Recovery
//
// Open deletes segments below the checkpoint and reads every segment from
// the checkpoint on, checking each batch. When a batch is damaged:
//
//   - In the last segment, if no intact batch of a later commit group
//     follows, the damage is a torn write from a crash during the last
//     commit: nothing in that group was acknowledged, because Append returns
//     only after the group's fsync. The tail is truncated at the first
//     damaged batch with a logged warning; the intact batches before it are
//     kept (some may belong to that unacknowledged group: delivering them
//     is harmless, the sink deduplicates and the apiserver retries the
//     batch anyway). Groups are written strictly one after another, each fsynced
//     before the next starts, so an intact batch of a later group proves the
//     damaged one had been fsynced: that is corruption, not a torn write.
//   - Anywhere else it is corruption of acknowledged data. Open fails with a
//     *CorruptError that names the file and the offset (errors.Is ErrCorrupt).
//     With Options.SkipCorrupt the spool instead resynchronises on the next
//     intact batch (searching for the batch magic and checking both CRCs),
//     logs an error naming file, offset and the bytes skipped, and keeps every
//     intact batch after the damage. Only the damaged bytes are lost. The
//     reader applies the same rule if it meets damage at run time.
//
// Open reads every unconfirmed byte once to check it, about a second per
// GiB here. An I/O error while appending fails the spool closed (see
// Append); reopening it recovers from what is on disk.
//
// With Options.NoSync a crash can lose or tear anything not yet written back
// by the kernel; it exists for tests and for measuring the cost of fsync.
package spool
