package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	wl "github.com/stampguard/stampguard/test/workload"
)

// report waits until the sink has stored every request of the run, prints
// `auditsink report` for the run's window, compares it with what the
// clients saw, and says where the dashboards are and how to reach
// ClickHouse from Grafana.
func (d *demo) report(ctx context.Context, res *wl.Result) error {
	d.step("waiting for the audit events to reach ClickHouse through the sink")
	events, err := res.WaitAudited(ctx)
	if err != nil {
		return fmt.Errorf("the apiserver's audit log: %w", err)
	}
	want, err := res.TruthAt(events)
	if err != nil {
		return err
	}
	window := []string{"--cluster", cluster, "--since", res.Since.Format(time.RFC3339Nano), "--until", res.Until.Format(time.RFC3339Nano)}
	var got []byte
	var stored report.Report
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err = d.auditsink(ctx, append([]string{"report", "--format", "json", "--top", "1000", "--history"}, window...)...)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(got, &stored); err != nil {
			return fmt.Errorf("auditsink report --format json: %w", err)
		}
		if stored.Totals.Requests >= want.Totals.Requests {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ClickHouse holds %d of the run's %d requests after 2 minutes (sink log: %s)", stored.Totals.Requests, want.Totals.Requests, d.sink.log)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(500 * time.Millisecond):
		}
	}
	d.note("%d requests stored", stored.Totals.Requests)
	if d.o.reportJSON != "" {
		if err := os.WriteFile(d.o.reportJSON, got, 0o644); err != nil {
			return err
		}
	}

	cmdline := "auditsink report --history " + strings.Join(window, " ")
	d.step("%s", cmdline)
	table, err := d.auditsink(ctx, append([]string{"report", "--history"}, window...)...)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "\n%s", table)

	wantJSON, _ := json.MarshalIndent(withoutHistory(want), "", "  ")
	gotJSON, _ := json.MarshalIndent(withoutHistory(stored), "", "  ")
	if bytes.Equal(wantJSON, gotJSON) {
		fmt.Fprintf(d.out, "\nThe report's counts equal what the %d requests' clients saw (test/workload's ground truth).\n", len(res.Requests))
	} else {
		_ = os.WriteFile(filepath.Join(d.state, "truth.json"), wantJSON, 0o644)
		fmt.Fprintf(d.out, "\nThe report differs from what the clients saw: compare %s with `%s --format json`.\n", d.rel(filepath.Join(d.state, "truth.json")), cmdline)
	}
	d.grafana()
	return nil
}

// withoutHistory is r without the findings on the field history: the
// clients' records do not say what each write stored, so the ground truth
// has none (the demo test holds the findings to what the records do say).
func withoutHistory(r report.Report) report.Report {
	r.LostUpdates, r.FieldFights, r.ConflictCauses, r.NoopWrites, r.FieldWriters = nil, nil, nil, nil, nil
	return r
}

// auditsink runs the built auditsink against the demo's ClickHouse and
// returns its standard output.
func (d *demo) auditsink(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "auditsink"), args...)
	cmd.Env = append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+d.dsn())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("auditsink %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// grafana says where the generated dashboards and alert rules are and
// what to type into Grafana's ClickHouse datasource.
func (d *demo) grafana() {
	gen := filepath.Join(d.root, "dashboards", "generated")
	d.step("dashboards and alert rules")
	dashboards, _ := filepath.Glob(filepath.Join(gen, "*.json"))
	rules, _ := filepath.Glob(filepath.Join(gen, "*.yaml"))
	if len(dashboards)+len(rules) == 0 {
		d.note("%s holds none in this checkout yet (the dashboards package generates them there)", d.rel(gen))
	}
	if len(dashboards) > 0 {
		d.note("dashboards (import into Grafana): %s", names(d, dashboards))
	}
	if len(rules) > 0 {
		d.note("alert rules (a Grafana alert provisioning file): %s", names(d, rules))
	}
	d.note("Grafana: add a ClickHouse datasource (plugin grafana-clickhouse-datasource) with")
	d.note("  server address 127.0.0.1, server port %d, protocol Native, secure off,", d.ch.Port)
	d.note("  username default, no password, default database stampguard;")
	d.note("  then import the dashboards and pick that datasource.")
	d.note("Try it yourself while the demo runs:")
	d.note("  AUDITSINK_CLICKHOUSE_DSN=%s %s report --history --cluster %s --since 1h", d.dsn(), d.rel(filepath.Join(d.bin, "auditsink")), cluster)
	d.note("  KUBECONFIG=%s kubectl get concurrencypolicies", d.rel(filepath.Join(d.state, "kubeconfig")))
	d.note("  Prometheus's alerts: http://%s/alerts; Alertmanager's: http://%s/api/v2/alerts (or amtool --alertmanager.url http://%s alert)",
		d.alerting.prometheus, d.alerting.alertmanager, d.alerting.alertmanager)
	d.note("Logs: %s", d.rel(d.logs))
}

func names(d *demo, paths []string) string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = d.rel(p)
	}
	return strings.Join(out, ", ")
}
