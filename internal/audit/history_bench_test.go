package audit_test

import (
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
)

// BenchmarkDecodeWrites decodes writes logged with their request and
// response (audittest.WriteWrites: 0.9-1.6 KB each) on one core, with the
// field history and without: what the history costs the sink per write.
func BenchmarkDecodeWrites(b *testing.B) {
	lines := audittest.Writes(b, 4000)
	h := audit.NewFieldHasher([]byte("bench"))
	for _, c := range []struct {
		name    string
		history *audit.FieldHasher
	}{{"history", &h}, {"no-history", nil}} {
		b.Run(c.name, func(b *testing.B) {
			d := audit.Decoder{History: c.history}
			var r audit.Row
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := d.Decode(lines[i%len(lines)], &r); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "µs/event")
		})
	}
}
