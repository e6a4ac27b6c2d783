package store

import (
	"os"
	"testing"
	"time"

	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
)

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
