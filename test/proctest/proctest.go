// Package proctest measures processes a benchmark starts: their CPU time
// and their peak resident memory, read from /proc.
package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// CPUSeconds is the user and system CPU time a running process has used.
func CPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// PeakRSS is a running process's high-water resident set, in bytes.
func PeakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Run starts cmd, waits for it, and returns its peak resident set, polled
// every 20ms: the rusage of a child of a large test process counts the
// parent's pages from before the exec.
func Run(cmd *exec.Cmd) (peak int64, err error) {
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	polled, exited := make(chan int64), make(chan struct{})
	go func() {
		var hwm int64
		for {
			hwm = max(hwm, PeakRSS(cmd.Process.Pid))
			select {
			case <-exited:
				polled <- hwm
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	err = cmd.Wait()
	close(exited)
	return <-polled, err
}
