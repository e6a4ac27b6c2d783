package spool_test

import (
	"context"
	"fmt"
	"os"

	"github.com/stampguard/stampguard/analytics/spool"
)

func Example() {
	dir, _ := os.MkdirTemp("", "spool-example")
	defer os.RemoveAll(dir)

	sp, err := spool.Open(dir, spool.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// An HTTP handler appends a batch; Append returns once it is fsynced.
	if _, err := sp.Append([][]byte{[]byte("event 1"), []byte("event 2")}); err != nil {
		fmt.Println(err)
		return
	}
	// The background writer reads, stores downstream, then confirms.
	b, err := sp.Next(context.Background(), 1000)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range b.Records {
		fmt.Println(string(r))
	}
	if err := sp.Confirm(b.End); err != nil {
		fmt.Println(err)
	}
	fmt.Println("pending:", sp.Stats().RecordsPending)
	sp.Close()
	// Output:
	// event 1
	// event 2
	// pending: 0
}
