package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one service process the demo started: its own process group (a
// Ctrl-C in the terminal reaches only the demo, which stops the services in
// order), a log file and a pid file in the run directory.
type proc struct {
	name, log, pidFile string
	cmd                *exec.Cmd
	exited             chan struct{}
	err                error // the exit status, once exited is closed
}

// startProc runs bin with args and env (added to the demo's environment).
func (d *demo) startProc(name, bin string, args, env []string) (*proc, error) {
	p := &proc{name: name, log: filepath.Join(d.logs, name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.cmd = cmd
	go func() { p.err = cmd.Wait(); logf.Close(); close(p.exited) }()
	if p.pidFile, err = d.writePID(name, cmd.Process.Pid); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// stop sends SIGTERM, waits up to 20 s, then SIGKILLs.
func (p *proc) stop() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	// The pid file stays: a later run skips it once the number no longer
	// runs this command line, and the e2e test checks it is gone.
}

// waitReady polls check until it succeeds, the process exits or timeout
// passes, and says which in the error.
func (p *proc) waitReady(ctx context.Context, what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			why := p.err
			if why == nil {
				why = errors.New("exit status 0")
			}
			return fmt.Errorf("%s exited at start (%w)%s; its log %s ends:\n%s", p.name, why, diagnose(p.log), p.log, logTail(p.log, 15))
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %s: %w (log: %s)", p.name, timeout, what, err, p.log)
		}
	}
}

// diagnose names the usual reasons a service does not start.
func diagnose(log string) string {
	b, _ := os.ReadFile(log)
	switch {
	case bytes.Contains(b, []byte("address already in use")) || bytes.Contains(b, []byte("Address already in use")):
		return ": its port is taken by another process"
	case bytes.Contains(b, []byte("no such file or directory")):
		return ": a file it needs is missing"
	}
	return ""
}

func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// httpOK is a readiness check: GET url answers 200.
func httpOK(c *http.Client, url string) func() error {
	return func() error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// writePID records pid as name's in the run's pids directory.
func (d *demo) writePID(name string, pid int) (string, error) {
	path := filepath.Join(d.pids, name+".pid")
	return path, writePIDFile(path, pid)
}

// writePIDFile writes pid with its start time (which, unlike the command
// line, is fixed from fork on), so that a later run stops only this
// process and not one that reused the number.
func writePIDFile(path string, pid int) error {
	return os.WriteFile(path, []byte(strconv.Itoa(pid)+"\n"+startTime(pid)+"\n"), 0o644)
}

// readPIDFile returns the pid in path and whether that process still runs.
func readPIDFile(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	num, start, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil || pid <= 1 {
		return 0, false
	}
	return pid, alive(pid) && startTime(pid) == strings.TrimSpace(start)
}

// startTime is field 22 of /proc/pid/stat, the process's start in clock
// ticks since boot ("" when pid is gone).
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// cmdline is /proc/pid/cmdline with spaces for NULs ("" when pid is gone).
func cmdline(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// leftovers are the processes of an earlier run under runDir: those its pid
// files name (if they still run), and any process whose
// command line names runDir (envtest's etcd and kube-apiserver keep their
// data there).
func leftovers(runDir string) []int {
	var pids []int
	files, _ := filepath.Glob(filepath.Join(runDir, "pids", "*.pid"))
	for _, f := range files {
		if pid, running := readPIDFile(f); running && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || slices.Contains(pids, pid) {
			continue
		}
		if strings.Contains(cmdline(pid), runDir+string(filepath.Separator)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killLeftovers stops an earlier run's processes: SIGTERM, then SIGKILL
// for those still there after 10 s.
func killLeftovers(runDir string) ([]int, error) {
	pids := leftovers(runDir)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	time.Sleep(100 * time.Millisecond)
	var still []string
	for _, pid := range pids {
		if alive(pid) {
			still = append(still, strconv.Itoa(pid))
		}
	}
	if len(still) > 0 {
		return pids, fmt.Errorf("processes of an earlier demo run did not stop: %s", strings.Join(still, ", "))
	}
	return pids, nil
}

// alive reports a process that exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// children are the processes whose parent is the demo, by name (envtest
// starts etcd and kube-apiserver itself).
func children(names ...string) map[string]int {
	out := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if i < 0 || j < i {
			continue
		}
		comm := string(b[i+1 : j])
		f := strings.Fields(string(b[j+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) || !slices.Contains(names, comm) {
			continue
		}
		out[comm] = pid
	}
	return out
}

// listener is one listening TCP socket.
type listener struct {
	addr netip.Addr
	port int
}

func (l listener) String() string { return netip.AddrPortFrom(l.addr, uint16(l.port)).String() }

// listeners are the TCP sockets pid listens on (IPv4 and IPv6), read from
// its file descriptors and /proc/net/tcp{,6}.
func listeners(pid int) ([]listener, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []listener
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			c := strings.Fields(sc.Text())
			if len(c) < 10 || c[3] != "0A" || !inodes[c[9]] {
				continue
			}
			hexAddr, hexPort, _ := strings.Cut(c[1], ":")
			addr, ok := procAddr(hexAddr)
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if ok && err == nil {
				out = append(out, listener{addr, int(p)})
			}
		}
		f.Close()
	}
	slices.SortFunc(out, func(a, b listener) int { return cmp.Or(cmp.Compare(a.port, b.port), a.addr.Compare(b.addr)) })
	return out, nil
}

// procAddr decodes /proc/net/tcp's address: 32-bit words in host order
// (little endian here).
func procAddr(h string) (netip.Addr, bool) {
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.Addr{}, false
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Unmap(), true
}

var errNoRepo = errors.New("not inside the stampguard repository (no go.mod with policy/ above the working directory)")

// repoRoot finds the module root above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "policy")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errNoRepo
		}
		dir = parent
	}
}
