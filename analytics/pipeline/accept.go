package pipeline

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/stampguard/stampguard/analytics/audit"
	"github.com/stampguard/stampguard/analytics/record"
)

// Accepter turns a stream of raw events into records (package record): it
// decodes each item, keeps the configured stages, and turns the rest into
// dead letters. It holds no state between calls and is safe for concurrent
// use.
type Accepter struct {
	Decoder audit.Decoder
	// Stages are the stages stored; defaulted to DefaultStages if empty.
	Stages []string
	// RecordRows caps the rows per record; defaulted to 5000.
	RecordRows int
	// RecordBytes starts a new record once one is this large; defaulted to
	// 16 MiB (large raw events must not make a record the spool refuses).
	RecordBytes int
}

// AcceptResult counts what Accept saw.
type AcceptResult struct {
	Accepted int // rows encoded
	Rejected int // dead letters
	Skipped  int // events of stages not stored
}

// Accept reads items until io.EOF and hands each finished record to emit
// (which must copy or persist it before returning). source names the input
// in dead letters and metrics. A read error of the stream is returned as
// is; records already emitted stay emitted (redelivery deduplicates them).
func (a *Accepter) Accept(cluster, source string, items audit.ItemReader, emit func(rec []byte) error) (AcceptResult, error) {
	return a.AcceptTally(cluster, source, items, nil, emit)
}

// AcceptTally is Accept that also counts each row it stores into tally
// (when not nil), as the row is decoded: the sink's live conflict
// signals, which its caller commits once the batch is acknowledged.
func (a *Accepter) AcceptTally(cluster, source string, items audit.ItemReader, tally *Tally, emit func(rec []byte) error) (AcceptResult, error) {
	var res AcceptResult
	maxRows, maxBytes := a.RecordRows, a.RecordBytes
	if maxRows <= 0 {
		maxRows = 5000
	}
	if maxBytes <= 0 {
		maxBytes = 16 << 20
	}
	stages := a.Stages
	if len(stages) == 0 {
		stages = audit.DefaultStages
	}
	buf := recPool.Get().(*[]byte)
	defer recPool.Put(buf)
	rec := record.AppendHeader((*buf)[:0], cluster)
	defer func() { *buf = rec[:0] }()
	header := len(rec)
	n := 0
	flush := func() error {
		if len(rec) == header {
			return nil
		}
		err := emit(rec)
		rec, n = rec[:header], 0
		return err
	}
	var row audit.Row
	for {
		// The row points into the reader's buffer only until it is
		// encoded below, before the next call.
		it, err := audit.NextRow(items, &a.Decoder, &row)
		if err != nil {
			if isEOF(err) {
				return res, flush()
			}
			return res, err
		}
		if it.Err == nil {
			if !slices.Contains(stages, row.Stage) {
				res.Skipped++
				continue
			}
			row.Cluster = cluster
			if tally != nil {
				tally.Add(&row)
			}
			rec = record.AppendRow(rec, &row)
			res.Accepted++
			if n++; n >= maxRows || len(rec) >= maxBytes {
				if err := flush(); err != nil {
					return res, err
				}
			}
			continue
		}
		d := audit.DeadLetter{Cluster: cluster, Source: source, Reason: it.Err.Error(),
			Raw: a.deadRaw(it.Raw), ReceivedAt: time.Now().UnixMicro()}
		rec = record.AppendDeadLetter(rec, &d)
		res.Rejected++
		if n++; n >= maxRows || len(rec) >= maxBytes {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
}

var recPool = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}

// deadRaw is what a dead letter keeps of an input it could not decode. An
// event that failed to decode cannot be redacted reliably, so one that
// mentions a redacted resource is withheld entirely.
func (a *Accepter) deadRaw(raw []byte) string {
	raw = audit.Sample(raw)
	for _, r := range append([]string{"secrets"}, a.Decoder.RedactResources...) {
		if bytes.Contains(raw, []byte(`"`+r+`"`)) {
			return "(withheld: the input names " + r + " and could not be redacted)"
		}
	}
	return string(raw)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
