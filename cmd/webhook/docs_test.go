package main

import (
	"flag"
	"io"
	"path/filepath"
	"testing"

	"github.com/stampguard/stampguard/internal/doccheck"
)

// Every `webhook` command line in README.md, docs/ and the chart README
// parses against the webhook's real flags: a renamed or removed flag, or a
// stray word, fails here.
func TestDocumentedCommandLinesParse(t *testing.T) {
	lines := doccheck.Invocations(t, filepath.Join("..", ".."), "webhook")
	var serve, configs int
	for _, inv := range lines {
		var fs *flag.FlagSet
		args := inv.Args
		if len(args) > 0 && args[0] == "configurations" {
			fs, _ = configurationsFlags()
			args = args[1:]
			configs++
		} else {
			fs, _ = serveFlags()
			serve++
		}
		fs.SetOutput(io.Discard)
		if err := doccheck.Check(fs, inv, args, 0); err != nil {
			t.Errorf("%s: %v", inv, err)
		}
	}
	// The README's flag listing alone has 17 lines; the register examples
	// at least two. Finding fewer means the scan broke, not the docs.
	if serve < 17 || configs < 3 {
		t.Errorf("found %d webhook and %d webhook configurations command lines; the scan missed some", serve, configs)
	}
}
