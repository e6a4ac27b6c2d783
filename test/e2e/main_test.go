package e2e

import (
	"os"
	"testing"

	"github.com/go-logr/logr"

	"github.com/stampguard/stampguard/internal/chdbtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func TestMain(m *testing.M) {
	// controller-runtime complains on stderr unless its global logger is set.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(chdbtest.Run(m)) // closes ClickHouse 26.7 (chDB) if a test loaded it
}
