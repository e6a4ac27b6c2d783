// Command gen writes stampguard's dashboards and alert rules (see package
// dashboards) into each -out directory, with the default parameters.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/stampguard/stampguard/dashboards"
)

type dirs []string

func (d *dirs) String() string     { return strings.Join(*d, ",") }
func (d *dirs) Set(v string) error { *d = append(*d, v); return nil }

func main() {
	var out dirs
	flag.Var(&out, "out", "directory to write the files into (repeatable; default "+dashboards.OutputDir+")")
	flag.Parse()
	if len(out) == 0 {
		out = dirs{dashboards.OutputDir}
	}
	if err := run(out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(out []string) error {
	g, err := dashboards.Generate(dashboards.Options{})
	if err != nil {
		return err
	}
	files, err := g.Files()
	if err != nil {
		return err
	}
	for _, dir := range out {
		if err := dashboards.Write(dir, files); err != nil {
			return err
		}
	}
	return nil
}
