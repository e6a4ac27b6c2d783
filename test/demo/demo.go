package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	wl "github.com/stampguard/stampguard/test/workload"
	"github.com/stampguard/stampguard/test/workload/contention"
)

// demo is one run. Paths are absolute.
type demo struct {
	o     options
	root  string // the repository
	dir   string // --dir
	bin   string // dir/bin: the built webhook and auditsink
	state string // dir/run: everything this run creates
	logs  string // run/logs
	pids  string // run/pids
	out   io.Writer
	tty   bool

	// stops undo the started services, last first.
	stops []func()

	ch       *chtest.Server
	sink     *sink
	env      *kubetest.Env
	webhook  *proc
	probes   string // the webhook's /metrics address
	alerting *alerting
}

func newDemo(o options) (*demo, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir := o.dir
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	d := &demo{o: o, root: root, dir: dir, bin: filepath.Join(dir, "bin"), state: filepath.Join(dir, "run"), out: os.Stdout}
	d.logs, d.pids = filepath.Join(d.state, "logs"), filepath.Join(d.state, "pids")
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		d.tty = true
	}
	if !filepath.IsAbs(o.policies) {
		d.o.policies = filepath.Join(root, o.policies)
	}
	return d, nil
}

func (d *demo) step(format string, args ...any) {
	if d.tty {
		fmt.Fprintf(d.out, "\n\033[1m==> "+format+"\033[0m\n", args...)
		return
	}
	fmt.Fprintf(d.out, "\n==> "+format+"\n", args...)
}

func (d *demo) note(format string, args ...any) { fmt.Fprintf(d.out, "    "+format+"\n", args...) }

// rel shows a path relative to the repository when it is inside it.
func (d *demo) rel(p string) string {
	if r, err := filepath.Rel(d.root, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// run is the whole story. stopSignals ends the demo's signal handling once
// it is shutting down, so that a second Ctrl-C kills it (the next run
// cleans up).
func (d *demo) run(ctx context.Context, stopSignals func()) (err error) {
	defer func() {
		stopSignals()
		if len(d.stops) > 0 {
			d.step("stopping everything")
		}
		d.shutdown()
	}()
	if err := d.clean(); err != nil {
		return err
	}
	if err := d.prepare(ctx); err != nil {
		return err
	}
	if err := d.start(ctx); err != nil {
		return err
	}
	res, err := d.play(ctx)
	if err != nil {
		return err
	}
	if err := d.report(ctx, res); err != nil {
		return err
	}
	if d.o.exit {
		return nil
	}
	fmt.Fprintf(d.out, "\nEverything keeps running; Ctrl-C stops it.\n")
	<-ctx.Done()
	fmt.Fprintln(d.out)
	return nil
}

// clean stops what an earlier run left behind and wipes its directory,
// unless that run's demo is still running.
func (d *demo) clean() error {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return err
	}
	self := filepath.Join(d.dir, "demo.pid")
	if pid, running := readPIDFile(self); running && pid != os.Getpid() {
		return fmt.Errorf("another demo (pid %d) is running in %s: stop it with Ctrl-C, or give this one another --dir", pid, d.rel(d.dir))
	}
	if err := writePIDFile(self, os.Getpid()); err != nil {
		return err
	}
	if _, err := os.Stat(d.state); err == nil {
		pids, err := killLeftovers(d.state)
		if len(pids) > 0 {
			d.step("stopped %d processes an earlier run left behind", len(pids))
		}
		if err != nil {
			return err
		}
		if err := os.RemoveAll(d.state); err != nil {
			return fmt.Errorf("remove the earlier run's state: %w", err)
		}
	}
	for _, p := range []string{d.bin, d.logs, d.pids, filepath.Join(d.state, "tmp"), filepath.Join(d.state, "kube")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	// envtest keeps etcd's data and the apiserver's certificates in
	// temporary directories: under the run, they go with it.
	return os.Setenv("TMPDIR", filepath.Join(d.state, "tmp"))
}

func (d *demo) shutdown() {
	for i := len(d.stops) - 1; i >= 0; i-- {
		d.stops[i]()
	}
	d.stops = nil
}

func (d *demo) onStop(name string, fn func()) {
	d.stops = append(d.stops, func() {
		fn()
		d.note("stopped %s", name)
	})
}

// start brings up ClickHouse, the sink, the control plane and the webhook,
// in the order each needs the one before.
func (d *demo) start(ctx context.Context) error {
	d.step("starting ClickHouse (Debian's clickhouse-server) on loopback")
	ch, err := chtest.StartServer(filepath.Join(d.state, "clickhouse"))
	if err != nil {
		return fmt.Errorf("ClickHouse would not start: %w", err)
	}
	d.ch = ch
	if _, err := d.writePID("clickhouse-server", ch.PID()); err != nil {
		return err
	}
	d.onStop("ClickHouse", ch.Stop)
	d.note("native port %d, data in %s", ch.Port, d.rel(ch.Dir))

	d.step("starting the audit sink (auditsink serve, TLS and a bearer token)")
	token := randomHex(16)
	if d.sink, err = d.startSink(ctx, token); err != nil {
		return err
	}
	d.note("https://%s, spool in %s", d.sink.addr, d.rel(filepath.Join(d.state, "spool")))

	d.step("starting etcd and kube-apiserver (audit to the sink and to a file)")
	env, err := kubetest.New(kubetest.Options{
		BinDir:             filepath.Join(d.root, "bin"),
		CRDDirs:            []string{filepath.Join(d.root, "charts", "stampguard", "crds")},
		Dir:                filepath.Join(d.state, "kube"),
		AuditPolicy:        wl.RequestResponseAuditPolicy,
		AuditLog:           true,
		AuditWebhookURL:    "https://" + d.sink.addr + "/clusters/" + cluster + "/events",
		AuditWebhookCAFile: d.sink.caFile,
		AuditWebhookToken:  token,
	})
	for name, pid := range children("etcd", "kube-apiserver") {
		if _, err := d.writePID(name, pid); err != nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("etcd and kube-apiserver would not start: %w", err)
	}
	d.env = env
	d.onStop("kube-apiserver and etcd", func() { _ = env.Stop() })
	kubeconfig := filepath.Join(d.state, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, env.Config); err != nil {
		return err
	}
	d.note("%s, kubeconfig %s, audit log %s", env.Config.Host, d.rel(kubeconfig), d.rel(env.AuditLogPath))

	d.step("starting the stampguard webhook (cluster mode) and registering it")
	if err := d.startWebhook(ctx, kubeconfig); err != nil {
		return err
	}

	d.step("starting Prometheus and Alertmanager (Debian's) with the chart's alert rules")
	if err := d.startAlerting(ctx, d.probes); err != nil {
		return err
	}
	if err := d.recordPorts(); err != nil {
		return err
	}

	d.step("applying %s", d.rel(d.o.policies))
	return d.applyPolicies(ctx)
}

// cluster is the name the sink stores the demo's events under.
const cluster = "demo"

// play runs the contention workload with a live status line.
func (d *demo) play(ctx context.Context) (*wl.Result, error) {
	d.step("running the writers for %s", d.o.duration)
	for _, l := range []string{
		fmt.Sprintf("%s read-modify-write configmap %s/%s, retrying on conflict", strings.Join(contention.Controllers, ", "), contention.Shop, contention.Catalog),
		fmt.Sprintf("the autoscaler writes %s/%s through /scale; it owns spec.replicas", contention.Shop, contention.Deployment),
		fmt.Sprintf("%s PUTs manifests without resourceVersion: refused in %s, audited in %s", contention.Script, contention.Shop, contention.Legacy),
		fmt.Sprintf("%s keeps PUTting a stale copy of %s (a retry loop that never ends)", contention.StuckOperator, contention.Catalog),
		fmt.Sprintf("%s and %s elect a leader through lease %s; the first crashes halfway", contention.WorkerA, contention.WorkerB, contention.Lease),
		fmt.Sprintf("%s PUTs its manifest over %s and trips the replicas owner and the team label", contention.DeployTool, contention.Deployment),
		fmt.Sprintf("in %s, unguarded: %s `kubectl replace`s a stale %s over %s's timeout, %s's stampless PUTs drop %s's flag (lost updates)",
			contention.Legacy, contention.ReleaseBot, contention.Checkout, contention.OnCall, contention.Script, contention.OnCall),
		fmt.Sprintf("in %s, the autoscaler and GitOps set %s's replicas back and forth (a field fight)", contention.Legacy, contention.Deployment),
	} {
		d.note("- %s", l)
	}
	fmt.Fprintln(d.out)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go d.alerting.watch(watchCtx)
	last := time.Time{}
	res, err := contention.Run(ctx, d.env.Config, contention.Options{
		Duration: d.o.duration, AuditLogPath: d.env.AuditLogPath,
		Status: func(s contention.Stats) {
			line := fmt.Sprintf("    %3.0fs / %.0fs   writes %d   version conflicts %d   refused by stampguard %d",
				min(s.Elapsed, s.Duration).Seconds(), s.Duration.Seconds(), s.Writes, s.Conflicts, s.Refusals)
			switch {
			case d.tty:
				fmt.Fprintf(d.out, "\r\033[K%s", line)
			case time.Since(last) >= 10*time.Second || s.Elapsed >= s.Duration:
				fmt.Fprintln(d.out, line)
				last = time.Now()
			}
		},
	})
	if d.tty {
		fmt.Fprintln(d.out)
	}
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	if err := writeJSON(filepath.Join(d.state, "requests.json"), recorded{Since: res.Since, Until: res.Until, Requests: res.Requests}); err != nil {
		return nil, err
	}

	d.step("the conflict storm, as Alertmanager received it from Prometheus")
	al := d.alerting.awaitStorm(ctx, time.Minute)
	if al == nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("no %s alert reached Alertmanager (http://%s) within a minute of the workload; Prometheus: http://%s/alerts, logs in %s",
			stormAlert, d.alerting.alertmanager, d.alerting.prometheus, d.rel(d.logs))
	}
	d.printAlert(al)

	d.step("a lost update, as Alertmanager received it from Prometheus (the sink counts them every %s)", lostUpdatesEvery)
	if al = d.alerting.await(ctx, lostUpdatesAlert, time.Minute); al == nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("no %s alert reached Alertmanager (http://%s) within a minute of the workload; the sink's gauge: http://%s/metrics (auditsink_lost_updates), logs in %s",
			lostUpdatesAlert, d.alerting.alertmanager, d.sink.metrics, d.rel(d.logs))
	}
	d.printAlert(al)
	return res, nil
}

// recorded is run/requests.json: what the workload's clients saw, the
// ground truth the e2e test computes the expected report from.
type recorded struct {
	Since    time.Time    `json:"since"`
	Until    time.Time    `json:"until"`
	Requests []wl.Request `json:"requests"`
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
