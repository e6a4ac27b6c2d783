package main

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/test/workload/contention"
	"sigs.k8s.io/yaml"
)

func TestDemoPoliciesMatchTheWorkload(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "demo-policies.yaml")
	ps, err := policy.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("loaded %d policies, want 3", len(ps))
	}
	// contention.Audited knows what the Audit-mode policy records.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, doc := range strings.Split(string(data), "\n---") {
		var p v1alpha1.ConcurrencyPolicy
		if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
			t.Fatal(err)
		}
		if p.Spec.Action == v1alpha1.ActionAudit {
			found = true
			if p.Name != contention.AuditPolicyName || !slices.Equal(p.Spec.Match.Namespaces, []string{contention.Legacy}) || !p.Spec.RequireResourceVersion {
				t.Errorf("the Audit-mode policy is %s on %v, want %s requiring a stamp in %s", p.Name, p.Spec.Match.Namespaces, contention.AuditPolicyName, contention.Legacy)
			}
		}
	}
	if !found {
		t.Error("no policy in Audit mode")
	}
}

// newTestDemo is a demo whose run directory is a temporary one.
func newTestDemo(t *testing.T) *demo {
	t.Helper()
	dir := t.TempDir()
	d := &demo{state: filepath.Join(dir, "run"), out: os.Stdout}
	d.logs, d.pids = filepath.Join(d.state, "logs"), filepath.Join(d.state, "pids")
	for _, p := range []string{d.logs, d.pids} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestAServiceThatCannotListenSaysItsPortIsTaken(t *testing.T) {
	d := newTestDemo(t)
	p, err := d.startProc("sink", "/bin/sh", []string{"-c", `echo "listen tcp 127.0.0.1:8443: bind: address already in use" >&2; exit 1`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = p.waitReady(t.Context(), "https://127.0.0.1:8443/healthz", time.Minute, func() error { return os.ErrNotExist })
	if err == nil || !strings.Contains(err.Error(), "sink exited at start") || !strings.Contains(err.Error(), "its port is taken") ||
		!strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error %v, want one naming the service, the taken port and the log", err)
	}
}

func TestAServiceThatNeverAnswersTimesOutByName(t *testing.T) {
	d := newTestDemo(t)
	p, err := d.startProc("webhook", "/bin/sleep", []string{"60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	err = p.waitReady(t.Context(), "http://127.0.0.1:1/readyz", 300*time.Millisecond, func() error { return os.ErrDeadlineExceeded })
	if err == nil || !strings.Contains(err.Error(), "webhook not ready after 300ms: http://127.0.0.1:1/readyz") {
		t.Fatalf("error %v, want one naming the service and what it waited for", err)
	}
}

func TestLeftoversOfAnEarlierRunAreFoundAndStopped(t *testing.T) {
	d := newTestDemo(t)
	// One process the run started itself (pid file), one that only names
	// the run directory (as envtest's etcd does), one that names neither.
	own, err := d.startProc("own", "/bin/sleep", []string{"60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer own.stop()
	named := exec.Command("/bin/sh", "-c", "while :; do sleep 0.1; done", d.state+"/tmp/x")
	stranger := exec.Command("/bin/sleep", "61")
	for _, c := range []*exec.Cmd{named, stranger} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.Wait() }()
		defer func() { _ = c.Process.Kill() }()
	}
	// A pid file whose number now runs something else is skipped.
	if err := os.WriteFile(filepath.Join(d.pids, "reused.pid"), []byte(strconv.Itoa(stranger.Process.Pid)+"\n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// (The shell's own children may show up too, caught between fork and
	// exec with its command line.)
	got := leftovers(d.state)
	if !slices.Contains(got, own.cmd.Process.Pid) || !slices.Contains(got, named.Process.Pid) || slices.Contains(got, stranger.Process.Pid) {
		t.Fatalf("leftovers = %v, want %d and %d but not the stranger %d", got, own.cmd.Process.Pid, named.Process.Pid, stranger.Process.Pid)
	}
	if _, err := killLeftovers(d.state); err != nil {
		t.Fatal(err)
	}
	select {
	case <-own.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the run's own process survived")
	}
	for i := 0; i < 100 && alive(named.Process.Pid); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(named.Process.Pid) {
		t.Fatal("the process naming the run directory survived")
	}
	if !alive(stranger.Process.Pid) {
		t.Fatal("a process that is not the demo's was stopped")
	}
}

func TestListeners(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v (no such stack here)", addr, err)
			continue
		}
		defer l.Close()
		ls, err := listeners(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		want := l.Addr().(*net.TCPAddr).AddrPort()
		found := false
		for _, got := range ls {
			found = found || (got.addr == want.Addr().Unmap() && got.port == int(want.Port()))
		}
		if !found {
			t.Errorf("listeners = %v, lacks %s", ls, want)
		}
	}
}

func TestASecondDemoInTheSameDirectoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	other := exec.Command("/bin/sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	pid := other.Process.Pid
	if err := writePIDFile(filepath.Join(dir, "demo.pid"), pid); err != nil {
		t.Fatal(err)
	}
	d := &demo{dir: dir, state: filepath.Join(dir, "run"), out: io.Discard}
	d.logs, d.pids = filepath.Join(d.state, "logs"), filepath.Join(d.state, "pids")
	err := d.clean()
	if err == nil || !strings.Contains(err.Error(), "another demo (pid "+strconv.Itoa(pid)+") is running") {
		t.Fatalf("clean = %v, want a refusal naming the running demo", err)
	}
	if !alive(pid) {
		t.Fatal("clean stopped the running demo")
	}
}
