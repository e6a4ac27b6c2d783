package logfile_test

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/stampguard/stampguard/internal/logfile"
)

func ExampleReader() {
	src := strings.NewReader("{\"auditID\":\"a\"}\n" + strings.Repeat("x", 40) + "\n{\"auditID\":\"b\"}\n")
	r, err := logfile.NewReader(src, logfile.ReaderOptions{MaxLineBytes: 32})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	for {
		line, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		var tooLong *logfile.LineTooLongError
		if errors.As(err, &tooLong) {
			fmt.Println("skipped a line at", tooLong.Offset, "of", tooLong.Length, "bytes")
			continue
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(line.Offset, string(line.Data))
	}
	// Output:
	// 0 {"auditID":"a"}
	// skipped a line at 16 of 40 bytes
	// 57 {"auditID":"b"}
}
