package store

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/internal/chdbtest"
	"github.com/stampguard/stampguard/internal/chtest"
)

// realEvents returns the JSON lines of ../testdata/events.jsonl, real
// apiserver event shapes (see DESIGN.md, "What the audit log says").
func realEvents(tb testing.TB) []string {
	tb.Helper()
	b, err := os.ReadFile("../testdata/events.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// micros is the Unix microseconds of an RFC 3339 time.
func micros(s string) int64 {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UnixMicro()
}

var tempDirs []string

func mkTemp() string {
	d, err := os.MkdirTemp("", "analytics-ch-")
	if err != nil {
		panic(err)
	}
	tempDirs = append(tempDirs, d)
	return d
}

func TestMain(m *testing.M) {
	code := chdbtest.Run(m)
	for i := len(processCleanups) - 1; i >= 0; i-- {
		processCleanups[i]()
	}
	for _, d := range tempDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

func chtestStart(tb testing.TB) *chtest.Server { return chtest.Start(tb) }
