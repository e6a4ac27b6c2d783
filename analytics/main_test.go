package analytics

import (
	dto "github.com/prometheus/client_model/go"
	"github.com/stampguard/stampguard/internal/chdbtest"
	"github.com/stampguard/stampguard/internal/chtest"
	"os"
	"testing"
)

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

func testutilValue(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func chtestStart(tb testing.TB) *chtest.Server { return chtest.Start(tb) }
