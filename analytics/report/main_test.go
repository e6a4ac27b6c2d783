package report

import (
	"testing"

	"github.com/stampguard/stampguard/test/chdbtest"
)

// The cross-engine suite loads ClickHouse 26.7 once for the test binary;
// Main closes it before the process exits.
func TestMain(m *testing.M) { chdbtest.Main(m) }
