package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chdbtest"
)

func TestMain(m *testing.M) {
	// controller-runtime complains on stderr unless its global logger is set.
	ctrllog.SetLogger(logr.Discard())
	code := chdbtest.Run(m) // closes ClickHouse 26.7 (chDB) if a test loaded it
	if err := bintest.RemoveAll(); err != nil {
		fmt.Fprintln(os.Stderr, "remove the built binaries:", err)
	}
	os.Exit(code)
}
