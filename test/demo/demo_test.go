package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/testenv"
	wl "github.com/stampguard/stampguard/test/workload"
	"github.com/stampguard/stampguard/test/workload/contention"
)

// TestDemo runs the demo program as `make demo` does, four times in one
// demo directory: from scratch with --exit; interrupted (SIGINT, as
// Ctrl-C) while its writers write; killed (SIGKILL) while its writers
// write, which leaves its services running; and with --exit again, which
// must stop those first. After each full run the report it printed (and
// wrote as JSON) must equal the report computed from what the workload's
// clients saw (run/requests.json, with the retry loops' times from the
// apiserver's audit log), and a replay of the demo's policies over its
// audit log must decide every write as its webhook did
// (replayEqualsEnforcement); after every run but the killed one no process
// of the demo and none of its ports may remain.
func TestDemo(t *testing.T) {
	testenv.SkipIfShort(t, "runs the demo: etcd, kube-apiserver, clickhouse-server, the webhook and the audit sink")
	root := kubetest.RepoRoot(t)
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "demo")
	build := exec.Command("go", "build", "-o", bin, "./test/demo")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/demo: %v\n%s", err, out)
	}
	dir := filepath.Join(tmp, "state")
	state := filepath.Join(dir, "run")

	full := func(t *testing.T) string {
		reportFile := filepath.Join(tmp, "report.json")
		_ = os.Remove(reportFile)
		out, code := runDemo(t, root, bin, nil, "--dir", dir, "--exit", "--duration", "15s", "--report-json", reportFile)
		if code != 0 {
			t.Fatalf("demo exited %d:\n%s", code, out)
		}
		want := truth(t, state)
		b, err := os.ReadFile(reportFile)
		if err != nil {
			t.Fatalf("--report-json: %v\n%s", err, out)
		}
		var got report.Report
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("--report-json is not the report's JSON: %v\n%s", err, b)
		}
		// The workload's records do not say what each write stored, so
		// the history findings are held to what they do say
		// (historyFindingsHold); every other section equals the truth.
		historyFindingsHold(t, &got, state)
		lostUpdatesHappened(t, got)
		wantJSON, _ := json.MarshalIndent(withoutHistory(want), "", "  ")
		gotJSON, _ := json.MarshalIndent(withoutHistory(got), "", "  ")
		if !bytes.Equal(wantJSON, gotJSON) {
			t.Errorf("the report differs from the clients' ground truth\nwant %s\ngot  %s", wantJSON, gotJSON)
		}
		tot := want.Totals
		line := fmt.Sprintf("requests %d   write attempts %d   version conflicts %d", tot.Requests, tot.WriteAttempts, tot.VersionConflicts)
		if !strings.Contains(out, line) {
			t.Errorf("the printed report lacks %q:\n%s", line, out)
		}
		// The storm alert, as Alertmanager received it from Prometheus.
		for _, s := range []string{"StampguardConflictStorm (active since", "labels       cluster=demo namespace=" + contention.Shop + " severity=critical",
			"summary      ", "dashboard    http://127.0.0.1:3000/d/stampguard-hot-objects?var-cluster=demo&var-namespace=" + contention.Shop,
			"The object at the centre: "} {
			if !strings.Contains(out, s) {
				t.Errorf("the printed alert lacks %q:\n%s", s, out)
			}
		}
		// The lost update, as Alertmanager received it from Prometheus.
		for _, s := range []string{"StampguardLostUpdates (active since", "labels       cause=laundered_stamp cluster=demo namespace=" + contention.Legacy + " severity=warning",
			"runbook_url  https://github.com/stampguard/stampguard/blob/main/README.md#runbook-lost-updates"} {
			if !strings.Contains(out, s) {
				t.Errorf("the printed lost-update alert lacks %q:\n%s", s, out)
			}
		}
		storyHappened(t, want)
		fileReportEqualsStored(t, filepath.Join(dir, "bin", "auditsink"), state, b)
		nothingLeft(t, state)
		// The demo's own audit log, written while its webhook decided.
		replayEqualsEnforcement(t, root, filepath.Join(dir, "bin", "webhook"), state)
		// The drafts suggested from it, replayed as the live webhook decided.
		suggestMatchesTheDemo(t, filepath.Join(dir, "bin", "auditsink"), state)
		return out
	}

	t.Run("from scratch", func(t *testing.T) { full(t) })
	t.Run("Ctrl-C while the writers write", func(t *testing.T) {
		out, code := runDemo(t, root, bin, func(line string, p *os.Process) {
			if strings.Contains(line, "/ 60s   writes") {
				_ = p.Signal(syscall.SIGINT)
			}
		}, "--dir", dir, "--duration", "60s")
		if code != 130 {
			t.Fatalf("an interrupted demo exited %d, want 130:\n%s", code, out)
		}
		if !strings.Contains(out, "stopped ClickHouse") {
			t.Errorf("the interrupted demo did not stop everything:\n%s", out)
		}
		nothingLeft(t, state)
	})
	t.Run("killed while the writers write", func(t *testing.T) {
		out, code := runDemo(t, root, bin, func(line string, p *os.Process) {
			if strings.Contains(line, "/ 60s   writes") {
				_ = p.Kill()
			}
		}, "--dir", dir, "--duration", "60s")
		if code != -1 {
			t.Fatalf("the killed demo exited %d:\n%s", code, out)
		}
		// Its services outlive it: the next run must stop them.
		if left := leftovers(state); len(left) < 5 {
			t.Fatalf("after a SIGKILL only %d of the demo's processes remain (%v); the rerun's clean-up is not tested", len(left), left)
		}
	})
	t.Run("again after the kill", func(t *testing.T) {
		out := full(t)
		if !strings.Contains(out, "processes an earlier run left behind") {
			t.Errorf("the rerun did not say it stopped the killed run's processes:\n%s", out)
		}
	})
}

// runDemo runs the demo and returns its combined output and exit code;
// onLine sees each line of output as it comes.
func runDemo(t *testing.T, root, bin string, onLine func(string, *os.Process), args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = root
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var out strings.Builder
	var mu sync.Mutex
	read := make(chan struct{})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if onLine != nil {
				onLine(sc.Text(), cmd.Process)
			}
		}
	}()
	err := cmd.Wait()
	pw.Close()
	<-read
	mu.Lock()
	defer mu.Unlock()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	}
	t.Fatalf("demo: %v\n%s", err, out.String())
	return "", 0
}

// truth is the report for run/requests.json, as test/workload computes it
// from the client's records.
func truth(t *testing.T, state string) report.Report {
	t.Helper()
	rec := readRecorded(t, state)
	res := &wl.Result{Requests: rec.Requests, Since: rec.Since, Until: rec.Until, AuditLogPath: filepath.Join(state, "kube", "audit.log")}
	res.Truth, res.Loops = contention.Truth(res.Requests, res.Since, res.Until)
	events, err := wl.ReadAuditLog(res.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	want, err := res.TruthAt(events)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// storyHappened checks that the run showed what the demo is for.
func storyHappened(t *testing.T, r report.Report) {
	t.Helper()
	if r.Totals.VersionConflicts == 0 {
		t.Error("no version conflicts")
	}
	stuck := false
	for _, l := range r.RetryLoops {
		stuck = stuck || (l.User == contention.StuckOperator && !l.Resolved)
	}
	if !stuck {
		t.Errorf("no unresolved retry loop of %s: %+v", contention.StuckOperator, r.RetryLoops)
	}
	if len(r.LeaseHolderChanges) == 0 || r.LeaseHolderChanges[0].Name != contention.Lease {
		t.Errorf("no leader takeover on %s: %+v", contention.Lease, r.LeaseHolderChanges)
	}
	seen := map[string]bool{}
	for _, d := range r.PolicyDecisions {
		seen[d.Policy+" "+d.Kind+" "+d.Action] = true
	}
	for _, want := range []string{
		"shop-configmaps stamp-missing deny", "shop-deployments stamp-missing deny", "shop-deployments field-owner deny",
		"shop-deployments immutable-field deny", "legacy-configmaps stamp-missing audit",
	} {
		if !seen[want] {
			t.Errorf("no policy decision %q: %+v", want, r.PolicyDecisions)
		}
	}
}

// nothingLeft checks that no process of the run lives (by its pid files and
// by the process list) and that none of its ports is still taken.
func nothingLeft(t *testing.T, state string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(state, "pids", "*.pid"))
	if len(files) < 5 {
		t.Errorf("only %d pid files in %s (clickhouse-server, auditsink, etcd, kube-apiserver, webhook)", len(files), state)
	}
	for _, f := range files {
		if pid, running := readPIDFile(f); running {
			t.Errorf("%s: process %d (%s) still runs", filepath.Base(f), pid, cmdline(pid))
		}
	}
	for _, pid := range leftovers(state) {
		// A process caught exiting at the moment of the scan is not one
		// that remains: give it a moment, then insist.
		what := cmdline(pid)
		for i := 0; i < 50 && alive(pid); i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("process %d (%s) still runs", pid, what)
		} else {
			t.Logf("process %d (%q) exited just after the demo", pid, what)
		}
	}
	b, err := os.ReadFile(filepath.Join(state, "ports"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 8 {
		t.Errorf("run/ports lists only %d listeners:\n%s", len(lines), b)
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("run/ports line %q", line)
		}
		addr, err := netip.ParseAddr(f[1])
		if err != nil || !addr.IsLoopback() {
			t.Errorf("%s listened on %s, not on loopback", f[0], f[1])
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(f[1], f[2]))
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("port %s of %s is still taken: %v", net.JoinHostPort(f[1], f[2]), f[0], err)
			} else {
				t.Errorf("listen on %s (a port of %s): %v", net.JoinHostPort(f[1], f[2]), f[0], err)
			}
			continue
		}
		l.Close()
	}
}

// lostUpdatesHappened checks that the legacy namespace's story is in the
// report: the release bot's laundered stamp over the on-call SRE's
// timeout, the script's stampless PUT over the SRE's flag, and the
// replicas fight between the autoscaler and GitOps; and that the guarded
// shop lost nothing.
func lostUpdatesHappened(t *testing.T, r report.Report) {
	t.Helper()
	want := map[[5]string]bool{
		{contention.Checkout, "data." + contention.TimeoutKey, contention.ReleaseBot, contention.OnCall, "laundered_stamp"}: false,
		{contention.Flags, "data." + contention.SearchFlag, contention.Script, contention.OnCall, "stampless"}:              false,
	}
	for _, l := range r.LostUpdates {
		if l.Namespace != contention.Legacy {
			t.Errorf("a lost update in %s, which the demo's policies guard: %+v", l.Namespace, l)
			continue
		}
		k := [5]string{l.Name, l.Field, l.Writer, l.OverwrittenWriter, l.Cause}
		if _, ok := want[k]; !ok {
			t.Errorf("a lost update the story has not: %+v", l)
		}
		want[k] = true
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no lost update of %s in %s/%s by %s over %s (%s); the report lists %+v", k[1], contention.Legacy, k[0], k[2], k[3], k[4], r.LostUpdates)
		}
	}
	fight := false
	for _, f := range r.FieldFights {
		fight = fight || (f.Namespace == contention.Legacy && f.Name == contention.Deployment && f.Field == "spec.replicas" &&
			slices.Equal(f.Writers, slices.Sorted(slices.Values([]string{contention.Autoscaler, contention.GitOps}))))
	}
	if !fight {
		t.Errorf("no fight between the autoscaler and GitOps over %s/%s's spec.replicas: %+v", contention.Legacy, contention.Deployment, r.FieldFights)
	}
}

// historyFindingsHold checks the report's history findings against the
// demo's client records: each lost update is a successful write the
// records hold, by its writer, on its object, with the cause its request
// shows (a stampless update has no stamp), over a successful write by
// another writer on that object before it; each attributed conflict is
// a version conflict of the writer on an object where the blocker wrote
// successfully; each no-op writer wrote successfully. The records hold
// every request the demo's writers sent.
func historyFindingsHold(t *testing.T, got *report.Report, state string) {
	t.Helper()
	rec := readRecorded(t, state)
	byID := map[string]wl.Request{}
	wrote := map[[3]string]bool{}      // writer, namespace, name: a successful write
	conflicted := map[[3]string]bool{} // writer, namespace, name: a version conflict
	for _, r := range rec.Requests {
		byID[r.AuditID] = r
		key := [3]string{r.Writer, r.Namespace, r.Name}
		switch {
		case r.Code >= 200 && r.Code < 300 && r.Verb != "get" && r.Verb != "list" && r.Verb != "watch":
			wrote[key] = true
		case r.Code == 409:
			conflicted[key] = true
		}
	}
	for _, l := range got.LostUpdates {
		w, ok := byID[l.AuditID]
		o, ok2 := byID[l.OverwrittenAuditID]
		switch {
		case !ok || !ok2:
			t.Errorf("lost update %+v: the records hold no request %s or %s", l, l.AuditID, l.OverwrittenAuditID)
		case w.Writer != l.Writer || o.Writer != l.OverwrittenWriter || w.Writer == o.Writer:
			t.Errorf("lost update %+v: the records say %s overwrote %s", l, w.Writer, o.Writer)
		case w.Namespace != l.Namespace || w.Name != l.Name || o.Namespace != l.Namespace || o.Name != l.Name:
			t.Errorf("lost update %+v: the records' writes are on %s/%s and %s/%s", l, w.Namespace, w.Name, o.Namespace, o.Name)
		case !o.Start.Before(w.Start) || w.Code >= 300 || o.Code >= 300:
			t.Errorf("lost update %+v: not a successful write after a successful write", l)
		case l.Cause == "stampless" && (w.Verb != "update" || w.Stamp != ""):
			t.Errorf("lost update %+v: the request was a %s with stamp %q", l, w.Verb, w.Stamp)
		}
	}
	for _, c := range got.ConflictCauses {
		if c.BlockedBy == "" {
			continue
		}
		found := false
		for k := range conflicted {
			if k[0] == c.Writer && wrote[[3]string{c.BlockedBy, k[1], k[2]}] {
				found = true
			}
		}
		if !found {
			t.Errorf("conflict cause %+v: no object where %s had a version conflict and %s wrote", c, c.Writer, c.BlockedBy)
		}
	}
	for _, n := range got.NoopWrites {
		found := false
		for k := range wrote {
			found = found || k[0] == n.User
		}
		if !found {
			t.Errorf("no-op writes %+v: the records hold no successful write by %s", n, n.User)
		}
	}
	t.Logf("history findings: %d lost updates, %d fights, %d conflict causes, %d no-op writers",
		len(got.LostUpdates), len(got.FieldFights), len(got.ConflictCauses), len(got.NoopWrites))
}

// fileReportEqualsStored requires `auditsink report FILE...` on the
// demo's audit log (the apiserver's log backend, beside the webhook
// backend that fed the sink) to print, for the run's window, the very JSON
// the demo printed from ClickHouse (stored).
func fileReportEqualsStored(t *testing.T, auditsink, state string, stored []byte) {
	t.Helper()
	rec := readRecorded(t, state)
	cmd := exec.Command(auditsink, "report", "--format", "json", "--top", "1000", "--history", "--cluster", cluster,
		"--since", rec.Since.Format(time.RFC3339Nano), "--until", rec.Until.Format(time.RFC3339Nano), filepath.Join(state, "kube", "audit.log"))
	cmd.Env = append(os.Environ(), chdbtest.LibEnv+"="+chdbtest.LibPath())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("auditsink report on the demo's audit log: %v\n%s", err, stderr.Bytes())
	}
	if !bytes.Equal(got, stored) {
		t.Errorf("the report from the demo's audit log differs from the one from ClickHouse\nfile   %s\nstored %s", got, stored)
	}
}

// readRecorded reads the demo's client records, run/requests.json.
func readRecorded(t *testing.T, state string) recorded {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "requests.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec recorded
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}
