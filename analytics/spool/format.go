package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

const (
	segmentMagic      = "SGSPOOL1"
	segmentHeaderSize = 16
	batchMagic        = "SGB1"
	batchHeaderSize   = 24
	recordHeaderSize  = 8
	// maxBatchBody is what fits the 32-bit body length field.
	maxBatchBody = math.MaxUint32
)

// castagnoli is the CRC32C table; it is only ever read.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodedSize is the number of bytes a batch of records takes on disk.
func encodedSize(records [][]byte) int64 {
	n := int64(batchHeaderSize)
	for _, r := range records {
		n += recordHeaderSize + int64(len(r))
	}
	return n
}

// encodeBatch frames records into buf (which must have encodedSize bytes).
// The group start is filled in later by setGroupStart, when the committer
// knows where the batch lands.
func encodeBatch(buf []byte, records [][]byte) {
	copy(buf[0:4], batchMagic)
	binary.LittleEndian.PutUint32(buf[8:12], uint32(len(records)))
	binary.LittleEndian.PutUint32(buf[12:16], uint32(len(buf)-batchHeaderSize))
	p := batchHeaderSize
	for _, r := range records {
		binary.LittleEndian.PutUint32(buf[p+4:p+8], uint32(len(r)))
		copy(buf[p+8:], r)
		crc := crc32.Update(0, castagnoli, buf[p+4:p+8+len(r)])
		binary.LittleEndian.PutUint32(buf[p:p+4], crc)
		p += recordHeaderSize + len(r)
	}
	setGroupStart(buf, 0)
}

// setGroupStart stores the commit group's start offset and reseals the
// header checksum.
func setGroupStart(buf []byte, groupStart int64) {
	binary.LittleEndian.PutUint64(buf[16:24], uint64(groupStart))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(buf[8:24], castagnoli))
}

// batchHeader is a decoded batch header.
type batchHeader struct {
	count      int
	bodyLen    int64
	groupStart int64
}

// errBadBatch marks a batch that fails its checks; callers turn it into a
// torn tail or a *CorruptError depending on where it is.
var errBadBatch = errors.New("bad batch")

// decodeBatchHeader checks the magic and the header checksum.
func decodeBatchHeader(h []byte) (batchHeader, error) {
	if len(h) < batchHeaderSize {
		return batchHeader{}, fmt.Errorf("%w: short header (%d bytes)", errBadBatch, len(h))
	}
	if string(h[0:4]) != batchMagic {
		return batchHeader{}, fmt.Errorf("%w: no batch magic", errBadBatch)
	}
	if crc32.Checksum(h[8:24], castagnoli) != binary.LittleEndian.Uint32(h[4:8]) {
		return batchHeader{}, fmt.Errorf("%w: header checksum mismatch", errBadBatch)
	}
	bh := batchHeader{
		count:      int(binary.LittleEndian.Uint32(h[8:12])),
		bodyLen:    int64(binary.LittleEndian.Uint32(h[12:16])),
		groupStart: int64(binary.LittleEndian.Uint64(h[16:24])),
	}
	// Each record needs at least its frame header: a count that cannot fit
	// the body is damage that happens to carry a valid CRC (or a bug).
	if int64(bh.count)*recordHeaderSize > bh.bodyLen || bh.groupStart < 0 {
		return batchHeader{}, fmt.Errorf("%w: inconsistent header", errBadBatch)
	}
	return bh, nil
}

// decodeBatchBody checks every record frame of body and appends the
// payloads (aliasing body) to dst.
func decodeBatchBody(dst [][]byte, body []byte, count int) ([][]byte, error) {
	p := 0
	for i := range count {
		if len(body)-p < recordHeaderSize {
			return dst, fmt.Errorf("%w: record %d: short frame", errBadBatch, i)
		}
		n := int(binary.LittleEndian.Uint32(body[p+4 : p+8]))
		if n > len(body)-p-recordHeaderSize {
			return dst, fmt.Errorf("%w: record %d: length %d past the batch end", errBadBatch, i, n)
		}
		want := binary.LittleEndian.Uint32(body[p : p+4])
		if crc32.Checksum(body[p+4:p+8+n], castagnoli) != want {
			return dst, fmt.Errorf("%w: record %d: checksum mismatch", errBadBatch, i)
		}
		dst = append(dst, body[p+8:p+8+n:p+8+n])
		p += recordHeaderSize + n
	}
	if p != len(body) {
		return dst, fmt.Errorf("%w: %d bytes after the last record", errBadBatch, len(body)-p)
	}
	return dst, nil
}

// decodeBatch decodes one whole batch at the start of b, returning its
// header, records (aliasing b) and its total size.
func decodeBatch(b []byte) (batchHeader, [][]byte, int64, error) {
	bh, err := decodeBatchHeader(b)
	if err != nil {
		return bh, nil, 0, err
	}
	end := batchHeaderSize + bh.bodyLen
	if int64(len(b)) < end {
		return bh, nil, 0, fmt.Errorf("%w: body needs %d bytes, %d there", errBadBatch, bh.bodyLen, len(b)-batchHeaderSize)
	}
	recs, err := decodeBatchBody(make([][]byte, 0, bh.count), b[batchHeaderSize:end], bh.count)
	if err != nil {
		return bh, nil, 0, err
	}
	return bh, recs, end, nil
}

// nextIntact finds the first offset after from where an intact batch starts
// in b, or -1. It is the resynchronisation step after damage: the batch
// magic narrows the candidates, and both checksums must hold.
func nextIntact(b []byte, from int) (int, batchHeader) {
	for i := from + 1; i < len(b); {
		j := bytes.Index(b[i:], []byte(batchMagic))
		if j < 0 {
			return -1, batchHeader{}
		}
		at := i + j
		if bh, _, _, err := decodeBatch(b[at:]); err == nil {
			return at, bh
		}
		i = at + 1
	}
	return -1, batchHeader{}
}

// encodeSegmentHeader returns the 16-byte header of segment seq.
func encodeSegmentHeader(seq uint64) []byte {
	h := make([]byte, segmentHeaderSize)
	copy(h, segmentMagic)
	binary.BigEndian.PutUint64(h[8:], seq)
	return h
}

// checkSegmentHeader reports whether h is the header of segment seq.
func checkSegmentHeader(h []byte, seq uint64) bool {
	return len(h) >= segmentHeaderSize && string(h[:8]) == segmentMagic && binary.BigEndian.Uint64(h[8:16]) == seq
}
