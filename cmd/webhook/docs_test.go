package main

import (
	"flag"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/test/doccheck"
)

// Every `webhook` command line in README.md, docs/ and the chart README
// parses against the webhook's real flags: a renamed or removed flag, or a
// stray word, fails here.
func TestDocumentedCommandLinesParse(t *testing.T) {
	lines := doccheck.Invocations(t, filepath.Join("..", ".."), "webhook")
	var serve, configs, replays int
	for _, inv := range lines {
		var fs *flag.FlagSet
		args := inv.Args
		maxOperands := 0
		if len(args) > 0 && args[0] == "configurations" {
			fs, _ = configurationsFlags()
			args = args[1:]
			configs++
		} else if len(args) > 0 && args[0] == "replay" {
			fs, _ = replayFlags()
			args = args[1:]
			maxOperands = -1 // the audit logs
			replays++
		} else {
			fs, _ = serveFlags()
			serve++
		}
		fs.SetOutput(io.Discard)
		if err := doccheck.Check(fs, inv, args, maxOperands); err != nil {
			t.Errorf("%s: %v", inv, err)
		}
	}
	// The README's flag listing alone has 17 lines; the register examples
	// at least two. Finding fewer means the scan broke, not the docs.
	if serve < 17 || configs < 3 || replays < 2 {
		t.Errorf("found %d webhook, %d webhook configurations and %d webhook replay command lines; the scan missed some", serve, configs, replays)
	}
}

// TestLinksNoClickHouseDriver keeps the webhook binary free of the
// ClickHouse driver: it runs in the admission path of every write and
// never talks to ClickHouse, so the driver would only add size and
// attack surface (replay reads audit logs, not the store).
func TestLinksNoClickHouseDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		if strings.HasPrefix(dep, "github.com/ClickHouse/") {
			t.Errorf("the webhook links %s", dep)
		}
	}
	if !slices.Contains(deps, "github.com/stampguard/stampguard/policy/replay") {
		t.Error("go list -deps does not list policy/replay: the check looks at the wrong package")
	}
}
