package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/stampguard/stampguard/test/promtest"
)

// prepare makes sure the control plane, ClickHouse and the two binaries
// are there, building or installing what is missing.
func (d *demo) prepare(ctx context.Context) error {
	missing := false
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(d.root, "bin", b)); err != nil {
			missing = true
		}
	}
	if missing {
		d.step("building kube-apiserver and etcd into bin/ (make controlplane)")
		d.note("the first time, Go downloads and compiles Kubernetes: about 13 minutes on 2 busy cores; later runs reuse bin/")
		if err := d.long(ctx, "make controlplane", d.make(ctx, "controlplane")); err != nil {
			return fmt.Errorf("build the control plane: %w", err)
		}
	}
	if _, err := exec.LookPath("clickhouse-server"); err != nil {
		d.step("installing Debian's clickhouse-server (make clickhouse: apt-get, needs root)")
		if err := d.long(ctx, "make clickhouse", d.make(ctx, "clickhouse")); err != nil {
			return fmt.Errorf("install clickhouse-server: %w", err)
		}
	}
	if _, err := os.Stat("/etc/clickhouse-server/config.xml"); err != nil {
		return fmt.Errorf("clickhouse-server is installed but /etc/clickhouse-server/config.xml is missing (%w): reinstall Debian's clickhouse-server", err)
	}

	for _, b := range []string{promtest.Prometheus, promtest.Promtool, promtest.Alertmanager} {
		if _, err := exec.LookPath(b); err != nil {
			d.step("installing Debian's prometheus and prometheus-alertmanager (make prometheus: apt-get, needs root)")
			if err := d.long(ctx, "make prometheus", d.make(ctx, "prometheus")); err != nil {
				return fmt.Errorf("install prometheus and prometheus-alertmanager: %w", err)
			}
			break
		}
	}
	if _, err := os.Stat(filepath.Join(d.root, "bin", "helm")); err != nil {
		d.step("installing helm into bin/ (make helm: go install), to render the chart's alert rules")
		if err := d.long(ctx, "make helm", d.make(ctx, "helm")); err != nil {
			return fmt.Errorf("install helm: %w", err)
		}
	}

	d.step("building the webhook and the audit sink into %s", d.rel(d.bin))
	d.note("the first build compiles the Kubernetes client libraries: about %s on 2 busy cores; later builds take seconds", firstBuild)
	build := exec.CommandContext(ctx, "go", "build", "-o", d.bin+string(filepath.Separator), "./cmd/webhook", "./cmd/auditsink")
	build.Dir = d.root
	if err := d.long(ctx, "go build", build); err != nil {
		return fmt.Errorf("build ./cmd/webhook and ./cmd/auditsink: %w", err)
	}
	return nil
}

// firstBuild is how long `go build ./cmd/webhook ./cmd/auditsink` took
// with an empty build cache (module downloads not included), measured on
// the 2 shared cores of the development machine.
const firstBuild = "5 minutes"

func (d *demo) make(ctx context.Context, target string) *exec.Cmd {
	c := exec.CommandContext(ctx, "make", "--no-print-directory", target)
	c.Dir = d.root
	return c
}

// long runs cmd with its output in the terminal and a line every 15 s that
// says it is still going.
func (d *demo) long(ctx context.Context, what string, cmd *exec.Cmd) error {
	cmd.Stdout, cmd.Stderr = d.out, d.out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			d.note("%s took %s", what, time.Since(start).Round(time.Second))
			return nil
		case <-tick.C:
			d.note("%s still running (%s)", what, time.Since(start).Round(time.Second))
		case <-ctx.Done():
			return <-done // CommandContext kills it
		}
	}
}
