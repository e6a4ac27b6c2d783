package logfile

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// benchLog is 10,000 audit-event-sized lines (about 2 KB each).
func benchLog(b *testing.B) []byte {
	b.Helper()
	line := `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","pad":"` + strings.Repeat("x", 1950) + `"}` + "\n"
	return bytes.Repeat([]byte(line), 10000)
}

// benchRead reads data (rawLen bytes once decompressed) b.N times.
func benchRead(b *testing.B, data []byte, rawLen, lines int) {
	b.ReportAllocs()
	b.SetBytes(int64(rawLen))
	var n int64
	for b.Loop() {
		r, err := NewReader(bytes.NewReader(data), ReaderOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	if n != int64(b.N)*int64(lines) {
		b.Fatalf("read %d lines, want %d", n, b.N*lines)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkReader reads 2 KB lines from memory, plain and gzip; MB/s
// counts decompressed bytes.
func BenchmarkReader(b *testing.B) {
	data := benchLog(b)
	b.Run("plain", func(b *testing.B) { benchRead(b, data, len(data), 10000) })
	b.Run("gzip", func(b *testing.B) { benchRead(b, gz(b, string(data)), len(data), 10000) })
}
