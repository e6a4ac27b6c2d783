package spool

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stampguard/stampguard/test/testenv"
)

// crashDirEnv makes the test binary run crashChild instead of the tests.
const crashDirEnv = "STAMPGUARD_SPOOL_CRASH_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		os.Exit(crashChild(dir, os.Getenv("STAMPGUARD_SPOOL_CRASH_ROUND")))
	}
	os.Exit(m.Run())
}

// crashChild appends from several goroutines and drains with a confirming
// reader until it is killed. It reports on stdout, one line each:
// "ack NAME" after Append returned, "cb NAME" before and "cd NAME" after a
// Confirm covering that batch.
func crashChild(dir, round string) int {
	sp, err := Open(dir, Options{SegmentBytes: 1 << 20, MaxBytes: 64 << 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 2
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(kind string, names []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range names {
			fmt.Fprintln(out, kind, n)
		}
		out.Flush()
	}
	go func() {
		for {
			b, err := sp.Next(context.Background(), 200)
			if err != nil {
				fmt.Fprintln(os.Stderr, "next:", err)
				os.Exit(3)
			}
			names := batchNames(b.Records)
			say("cb", names)
			if err := sp.Confirm(b.End); err != nil {
				fmt.Fprintln(os.Stderr, "confirm:", err)
				os.Exit(3)
			}
			say("cd", names)
		}
	}()
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				name := fmt.Sprintf("r%s.w%d.%d", round, g, i)
				if _, err := sp.Append(batch(name, 40, 2000)); err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(3)
				}
				say("ack", []string{name})
			}
		}()
	}
	select {} // until SIGKILL
}

// batchNames returns the distinct batch names of records made by batch.
func batchNames(recs [][]byte) []string {
	var names []string
	for _, r := range recs {
		n, _, _ := strings.Cut(string(r), "/")
		if len(names) == 0 || names[len(names)-1] != n {
			names = append(names, n)
		}
	}
	return names
}

// TestCrashKeepsAcknowledgedBatches kills a child process mid-append
// (SIGKILL) three times over the same spool and checks that every batch the
// child saw acknowledged is there, whole, and that nothing confirmed comes
// back. A killed process leaves the page cache behind, so this proves the
// acknowledge and confirm protocol, not fsync against power loss; the torn
// tail tests cover what a power loss leaves on disk.
func TestCrashKeepsAcknowledgedBatches(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	dir := t.TempDir()
	acked := map[string]bool{}
	confirming := map[string]bool{}
	confirmed := map[string]bool{}
	for round := range 3 {
		cmd := exec.CommandContext(t.Context(), os.Args[0])
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, fmt.Sprint("STAMPGUARD_SPOOL_CRASH_ROUND=", round))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		acks := 0
		killed := false
		for sc.Scan() {
			kind, name, _ := strings.Cut(sc.Text(), " ")
			switch kind {
			case "ack":
				acked[name] = true
				acks++
			case "cb":
				confirming[name] = true
			case "cd":
				confirmed[name] = true
			}
			// Kill mid-stream: appends, fsyncs and confirms are in flight.
			if acks == 150 && !killed {
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
		}
		_ = cmd.Wait() // killed on purpose: the exit status says nothing
		if !killed {
			t.Fatalf("round %d: child ended by itself: %s", round, stderr.String())
		}
	}

	sp := open(t, dir, Options{})
	recs, _ := drain(t, sp)
	present := map[string]int{}
	for _, r := range recs {
		n, _, _ := strings.Cut(string(r), "/")
		present[n]++
	}
	for n, count := range present {
		if count != 40 {
			t.Errorf("batch %s has %d records, want all 40 or none", n, count)
		}
		if confirmed[n] {
			t.Errorf("batch %s was confirmed but is replayed", n)
		}
	}
	lost := 0
	for n := range acked {
		if present[n] == 0 && !confirming[n] {
			lost++
			t.Errorf("acknowledged batch %s is lost", n)
		}
	}
	t.Logf("%d batches acknowledged, %d confirmed, %d replayed, %d lost", len(acked), len(confirmed), len(present), lost)
	if len(acked) < 3*150 {
		t.Fatalf("only %d acknowledged batches seen", len(acked))
	}
}
