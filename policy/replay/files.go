package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/stampguard/stampguard/internal/logfile"
)

// Files replays audit log files (plain or gzip, as the apiserver writes
// and rotates them) in the order of their first events' times, so that
// rotated files may be given in any order. A line that is no audit event
// is counted in Report.Skipped; a file that cannot be read is an error.
func Files(ctx context.Context, r *Replayer, paths []string) error {
	type file struct {
		path  string
		first time.Time
	}
	files := make([]file, 0, len(paths))
	for _, p := range paths {
		t, err := firstTime(p)
		if err != nil {
			return err
		}
		files = append(files, file{p, t})
	}
	slices.SortStableFunc(files, func(a, b file) int { return a.first.Compare(b.first) })
	for _, f := range files {
		if err := r.file(ctx, f.path); err != nil {
			return err
		}
	}
	return nil
}

// firstTime is the time of a file's first audit event (zero for none).
func firstTime(path string) (time.Time, error) {
	lr, err := logfile.Open(path, logfile.ReaderOptions{})
	if err != nil {
		return time.Time{}, err
	}
	defer lr.Close()
	var ev event
	for {
		l, err := lr.Next()
		switch {
		case errors.Is(err, io.EOF):
			return time.Time{}, nil
		case errors.Is(err, logfile.ErrLineTooLong):
			continue
		case err != nil:
			return time.Time{}, fmt.Errorf("read audit log %s: %w", path, err)
		}
		if parseEvent(l.Data, &ev) == nil {
			return ev.time, nil
		}
	}
}

func (r *Replayer) file(ctx context.Context, path string) error {
	lr, err := logfile.Open(path, logfile.ReaderOptions{})
	if err != nil {
		return err
	}
	defer lr.Close()
	return r.Lines(ctx, lr)
}

// LineReader yields lines, as logfile.Reader does.
type LineReader interface {
	Next() (logfile.Line, error)
}

// Lines replays every line of lr until io.EOF.
func (r *Replayer) Lines(ctx context.Context, lr LineReader) error {
	for n := 0; ; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		l, err := lr.Next()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, logfile.ErrLineTooLong):
			r.acc.skipped++
			continue
		case err != nil:
			return fmt.Errorf("read audit log: %w", err)
		}
		if err := r.Event(l.Data); err != nil {
			r.acc.skipped++
		}
	}
}
