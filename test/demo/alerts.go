package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/stampguard/stampguard/test/promtest"
)

// The chart's values the demo renders its rules with: the chart's alerts
// on the demo's timescale (a 2s scrape and evaluation, a 30s storm
// window), and a Grafana base URL for the dashboard links.
var demoRuleValues = []string{
	"prometheusRule.interval=2s",
	"prometheusRule.conflictStorm.window=30s", "prometheusRule.conflictStorm.for=2s",
	"prometheusRule.writerConflictStorm.window=30s", "prometheusRule.writerConflictStorm.for=2s",
	"prometheusRule.grafanaURL=http://127.0.0.1:3000",
}

// The alerts the demo waits for in Alertmanager: the storm during the
// workload, and after it the lost update of the release bot's laundered
// stamp (the sink counts lost updates every lostUpdatesEvery, the demo's
// timescale for the chart's 1m).
const (
	stormAlert       = "StampguardConflictStorm"
	lostUpdatesAlert = "StampguardLostUpdates"
	lostUpdatesEvery = "5s"
)

// alertFilter is Alertmanager's matcher of an alert by name and, for the
// lost updates, the release bot's cause.
func alertFilter(name string) []string {
	if name == lostUpdatesAlert {
		return []string{`alertname="` + name + `"`, `cause="laundered_stamp"`}
	}
	return []string{`alertname="` + name + `"`}
}

// alerting is the running Prometheus and Alertmanager.
type alerting struct {
	prometheus, alertmanager string // addresses

	mu       sync.Mutex
	received *amAlert // the first storm alert Alertmanager listed
}

// amAlert is an alert as Alertmanager's API v2 lists it (GET
// /api/v2/alerts).
type amAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	Status      struct {
		State string `json:"state"`
	} `json:"status"`
}

// startAlerting starts Debian's Alertmanager and Prometheus on loopback:
// Prometheus scrapes the webhook's and the sink's /metrics every 2s,
// evaluates the chart's rules (rendered by helm) and sends to
// Alertmanager.
func (d *demo) startAlerting(ctx context.Context, webhookMetrics string) error {
	dir := filepath.Join(d.state, "alerting")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rules, err := promtest.ChartRules(filepath.Join(d.root, "bin", "helm"), filepath.Join(d.root, "charts", "stampguard"), demoRuleValues...)
	if err != nil {
		return fmt.Errorf("render the chart's rules: %w", err)
	}
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		return err
	}
	a := &alerting{}
	if a.alertmanager, err = freeAddr(); err != nil {
		return err
	}
	if a.prometheus, err = freeAddr(); err != nil {
		return err
	}
	amConfig := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(amConfig, []byte(`route: {receiver: demo, group_by: [alertname, cluster, namespace], group_wait: 1s, group_interval: 5s, repeat_interval: 1h}
receivers: [{name: demo}]
`), 0o644); err != nil {
		return err
	}
	bin, err := promtest.Binary(promtest.Alertmanager)
	if err != nil {
		return err
	}
	am, err := d.startProc("alertmanager", bin, []string{"--config.file", amConfig, "--storage.path", filepath.Join(dir, "alertmanager"),
		"--web.listen-address", a.alertmanager, "--cluster.listen-address", "", "--log.level", "warn"}, nil)
	if err != nil {
		return err
	}
	d.onStop("Alertmanager", am.stop)
	if err := am.waitReady(ctx, "http://"+a.alertmanager+"/-/ready", time.Minute, httpOK(http.DefaultClient, "http://"+a.alertmanager+"/-/ready")); err != nil {
		return fmt.Errorf("the alertmanager would not start: %w", err)
	}
	d.note("Alertmanager http://%s (Debian's prometheus-alertmanager)", a.alertmanager)

	promConfig := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promConfig, []byte(fmt.Sprintf(`global: {scrape_interval: 2s, evaluation_interval: 2s}
rule_files: [%q]
alerting:
  alertmanagers: [{static_configs: [{targets: [%q]}]}]
scrape_configs:
  - job_name: stampguard-webhook
    static_configs: [{targets: [%q]}]
  - job_name: stampguard-auditsink
    static_configs: [{targets: [%q]}]
`, rulesFile, a.alertmanager, webhookMetrics, d.sink.metrics)), 0o644); err != nil {
		return err
	}
	if bin, err = promtest.Binary(promtest.Prometheus); err != nil {
		return err
	}
	prom, err := d.startProc("prometheus", bin, []string{"--config.file", promConfig, "--storage.tsdb.path", filepath.Join(dir, "prometheus"),
		"--web.listen-address", a.prometheus, "--log.level", "warn"}, nil)
	if err != nil {
		return err
	}
	d.onStop("Prometheus", prom.stop)
	if err := prom.waitReady(ctx, "http://"+a.prometheus+"/-/ready", time.Minute, httpOK(http.DefaultClient, "http://"+a.prometheus+"/-/ready")); err != nil {
		return fmt.Errorf("the prometheus server would not start: %w", err)
	}
	d.note("Prometheus http://%s scraping the webhook and the sink every 2s, with the chart's rules (%s)", a.prometheus, d.rel(rulesFile))
	d.note("rendered by helm template --set %s", strings.Join(append([]string{"prometheusRule.enabled=true"}, demoRuleValues...), ","))
	d.alerting = a
	return nil
}

// watch polls Alertmanager's API every second until ctx ends or a storm
// alert is listed, and keeps the first one: the storm fires during the
// workload and resolves after it.
func (a *alerting) watch(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if al := a.poll(ctx, stormAlert); al != nil {
			a.mu.Lock()
			a.received = al
			a.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// poll lists the active alerts of name, and returns the first.
func (a *alerting) poll(ctx context.Context, name string) *amAlert {
	q := url.Values{"filter": alertFilter(name), "active": {"true"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.alertmanager+"/api/v2/alerts?"+q.Encode(), nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var alerts []amAlert
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&alerts) != nil || len(alerts) == 0 {
		return nil
	}
	return &alerts[0]
}

// awaitStorm waits up to timeout for the watcher's storm alert.
func (a *alerting) awaitStorm(ctx context.Context, timeout time.Duration) *amAlert {
	deadline := time.Now().Add(timeout)
	for {
		a.mu.Lock()
		al := a.received
		a.mu.Unlock()
		if al != nil || time.Now().After(deadline) || ctx.Err() != nil {
			return al
		}
		if al = a.poll(ctx, stormAlert); al != nil {
			return al
		}
		time.Sleep(time.Second)
	}
}

// await waits up to timeout for an active alert of name.
func (a *alerting) await(ctx context.Context, name string, timeout time.Duration) *amAlert {
	deadline := time.Now().Add(timeout)
	for {
		if al := a.poll(ctx, name); al != nil || time.Now().After(deadline) || ctx.Err() != nil {
			return al
		}
		time.Sleep(time.Second)
	}
}

// printAlert shows the alert as Alertmanager received it.
func (d *demo) printAlert(al *amAlert) {
	d.note("%s (%s since %s), as Alertmanager's API lists it:", al.Labels["alertname"], al.Status.State, al.StartsAt.UTC().Format(time.TimeOnly))
	keys := make([]string, 0, len(al.Labels))
	for k := range al.Labels {
		if k != "alertname" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var labels []string
	for _, k := range keys {
		labels = append(labels, k+"="+al.Labels[k])
	}
	d.note("  labels       %s", strings.Join(labels, " "))
	for _, k := range []string{"summary", "description", "dashboard", "runbook_url"} {
		d.note("  %-12s %s", k, al.Annotations[k])
	}
}
