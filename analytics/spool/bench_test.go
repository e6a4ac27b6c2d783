package spool

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
)

// benchBatch is an apiserver-sized batch: 400 events of about 2 KB.
func benchBatch() [][]byte { return batch("bench", 400, 2048) }

// startDrainer reads and confirms in the background, as the sink's writer
// does, so the spool stays small during long runs.
func startDrainer(b *testing.B, sp *Spool) {
	b.Helper()
	go func() {
		for {
			bt, err := sp.Next(b.Context(), 4000)
			if err != nil {
				return
			}
			if err := sp.Confirm(bt.End); err != nil {
				b.Error(err)
				return
			}
		}
	}()
}

func benchOpen(b *testing.B, noSync bool) *Spool {
	b.Helper()
	sp, err := Open(b.TempDir(), Options{NoSync: noSync, MaxBytes: 8 << 30, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sp.Close() })
	startDrainer(b, sp)
	return sp
}

func reportRecords(b *testing.B, n int64) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkAppend appends 400 x 2 KB batches one after another: every
// Append pays a whole fsync.
func BenchmarkAppend(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("fsync=%v", !noSync), func(b *testing.B) {
			sp := benchOpen(b, noSync)
			recs := benchBatch()
			b.SetBytes(encodedSize(recs))
			b.ReportAllocs()
			var n int64
			for b.Loop() {
				if _, err := sp.Append(recs); err != nil {
					b.Fatal(err)
				}
				n += int64(len(recs))
			}
			reportRecords(b, n)
		})
	}
}

// BenchmarkAppendParallel appends from many goroutines, as concurrent
// HTTP handlers do: commit groups share one fsync. With 400 x 2 KB batches
// the disk's bandwidth is the limit; with single 2 KB records the fsync
// latency is, and group commit is what keeps the rate up.
func BenchmarkAppendParallel(b *testing.B) {
	for _, size := range []int{400, 1} {
		for _, par := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("records=%d/appenders=%dxGOMAXPROCS", size, par), func(b *testing.B) {
				sp := benchOpen(b, false)
				recs := batch("bench", size, 2048)
				b.SetBytes(encodedSize(recs))
				b.ReportAllocs()
				b.SetParallelism(par)
				var n atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := sp.Append(recs); err != nil && !errors.Is(err, ErrClosed) {
							b.Error(err)
							return
						}
						n.Add(int64(len(recs)))
					}
				})
				reportRecords(b, n.Load())
			})
		}
	}
}

// BenchmarkNext reads back 400 x 2 KB batches (no fsync on the read side).
func BenchmarkNext(b *testing.B) {
	sp, err := Open(b.TempDir(), Options{NoSync: true, MaxBytes: 8 << 30, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer sp.Close()
	recs := benchBatch()
	b.SetBytes(encodedSize(recs))
	b.ReportAllocs()
	var n int64
	for b.Loop() {
		b.StopTimer()
		if _, err := sp.Append(recs); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		bt, err := sp.Next(b.Context(), 400)
		if err != nil {
			b.Fatal(err)
		}
		if err := sp.Confirm(bt.End); err != nil {
			b.Fatal(err)
		}
		n += int64(len(bt.Records))
	}
	reportRecords(b, n)
}
