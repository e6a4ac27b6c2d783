package pipeline

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

func TestQueueHandsOutInOrderWithinItsBound(t *testing.T) {
	ctx := t.Context()
	var confirmed []any
	q := NewQueue(10, func(m any) error { confirmed = append(confirmed, m); return nil })
	if err := q.Append(ctx, []byte("aaaaaa"), nil); err != nil {
		t.Fatal(err)
	}
	if err := q.Append(ctx, []byte("bbbb"), "b"); err != nil {
		t.Fatal(err)
	}
	// Full: the next append waits until records are handed out.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := q.Append(short, []byte("c"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append to a full queue: %v, want it to wait", err)
	}
	appended := make(chan error, 1)
	go func() { appended <- q.Append(ctx, []byte("cc"), "c") }()
	b, err := q.Next(ctx, 1)
	if err != nil || len(b.Records) != 1 || string(b.Records[0]) != "aaaaaa" {
		t.Fatalf("first Next: %q %v", b.Records, err)
	}
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if err := q.Confirm(b.End); err != nil || len(confirmed) != 0 {
		t.Fatalf("confirming a record without a mark called back with %v (%v)", confirmed, err)
	}
	q.Close()
	if err := q.Append(ctx, []byte("d"), nil); err == nil {
		t.Fatal("append after Close succeeded")
	}
	b2, err := q.Next(ctx, 10)
	if err != nil || len(b2.Records) != 2 || string(b2.Records[0]) != "bbbb" || string(b2.Records[1]) != "cc" {
		t.Fatalf("second Next: %q %v", b2.Records, err)
	}
	if _, err := q.Next(ctx, 10); !errors.Is(err, io.EOF) {
		t.Fatalf("Next of a closed, empty queue: %v, want io.EOF", err)
	}
	if err := q.Confirm(b2.End); err != nil || len(confirmed) != 1 || confirmed[0] != "c" {
		t.Fatalf("confirmed %v (%v), want the last mark only", confirmed, err)
	}
}
