package main

import (
	"flag"
	"io"
	"path/filepath"
	"testing"

	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/test/doccheck"
)

// Every `auditsink` command line in README.md, docs/ and the chart README
// parses against the real flags of its subcommand: a renamed or removed
// flag, an unknown subcommand, or a stray word fails here.
func TestDocumentedCommandLinesParse(t *testing.T) {
	lines := doccheck.Invocations(t, filepath.Join("..", ".."), "auditsink")
	checked := map[string]int{}
	for _, inv := range lines {
		if len(inv.Args) == 0 || cli.IsHelp(inv.Args[0]) || inv.Args[0] == "<command>" {
			continue // the bare name in prose, or the usage line
		}
		var cmd *command
		for i := range commands {
			if commands[i].name == inv.Args[0] {
				cmd = &commands[i]
			}
		}
		if cmd == nil {
			t.Errorf("%s: no subcommand %q", inv, inv.Args[0])
			continue
		}
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cmd.bind(fs, io.Discard, io.Discard)
		if err := doccheck.Check(fs, inv, inv.Args[1:], cmd.maxOperands); err != nil {
			t.Errorf("%s: %v", inv, err)
		}
		checked[cmd.name]++
	}
	for _, c := range commands {
		if checked[c.name] == 0 {
			t.Errorf("no documented command line of auditsink %s was found; the scan broke", c.name)
		}
	}
	t.Logf("checked %v", checked)
}
