package pipeline

import (
	"fmt"
	"io"
	"time"
)

// progress draws ingest's progress line on w about every 200ms, until the
// returned stop is called (which draws it a last time).
func progress(w io.Writer, total int64, n *ingestCounts) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	draw := func() {
		d := n.bytes.Load()
		pct := 100.0
		if total > 0 {
			pct = min(100, 100*float64(d)/float64(total))
		}
		const width = 30
		filled := int(pct / 100 * width)
		bar := make([]byte, width)
		for i := range bar {
			bar[i] = ' '
			if i < filled {
				bar[i] = '='
			}
		}
		secs := time.Since(start).Seconds()
		eta := "--"
		if d > 0 && total > d {
			eta = (time.Duration(float64(total-d) / float64(d) * secs * float64(time.Second))).Round(time.Second).String()
		}
		fmt.Fprintf(w, "\r[%s] %5.1f%%  %.1f MiB  %.0f events/s  ETA %s ", bar, pct, float64(d)/(1<<20), float64(n.events.Load())/secs, eta)
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				draw()
				fmt.Fprintln(w)
				return
			case <-t.C:
				draw()
			}
		}
	}()
	return func() { close(stop); <-finished }
}
