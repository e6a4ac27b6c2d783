// Command gen writes stampguard's dashboards and alert rules (see package
// dashboards) into each -out directory. Without flags it writes the
// committed files; the flags set the parameters a site changes most (the
// rest are dashboards.Options, from Go).
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
	var o dashboards.Options
	flag.Var(&out, "out", "directory to write the files into (repeatable; default "+dashboards.OutputDir+")")
	flag.StringVar(&o.Database, "database", "", "ClickHouse database auditsink writes (default stampguard)")
	flag.StringVar(&o.Folder, "folder", "", "Grafana folder of the alert rules (default stampguard)")
	flag.StringVar(&o.Alerts.Cluster, "cluster", "", "source cluster the ClickHouse alert rules watch (default default)")
	flag.StringVar(&o.Alerts.ClickHouseUID, "clickhouse-uid", "", "UID of the ClickHouse data source the alert rules query (default clickhouse)")
	flag.StringVar(&o.Alerts.PrometheusUID, "prometheus-uid", "", "UID of the Prometheus data source the alert rules query (default prometheus)")
	flag.Parse()
	if len(out) == 0 {
		out = dirs{dashboards.OutputDir}
	}
	if err := run(o, out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(o dashboards.Options, out []string) error {
	g, err := dashboards.Generate(o)
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
