package filereport

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The kept directory's plan: what to read again and when to start over,
// so that the database holds the events of the files given and of nothing
// else.
func TestKeepReadsWhatChangedAndStartsOverForOthers(t *testing.T) {
	files := t.TempDir()
	a, b := filepath.Join(files, "a.log"), filepath.Join(files, "b.log")
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(a, "line a1\n")
	write(b, "line b1\n")
	dir := filepath.Join(t.TempDir(), "kept")

	// step opens the kept directory with files, checks its plan and
	// commits it, as a report that succeeded.
	step := func(name, cluster string, wantRead []string, wantStartOver bool, files ...string) {
		t.Helper()
		k, err := openKeep(dir, cluster, files)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer k.unlock()
		if !slices.Equal(k.toRead(), wantRead) || k.startOver != wantStartOver {
			t.Fatalf("%s: reads %v (start over %v), want %v (%v)", name, k.toRead(), k.startOver, wantRead, wantStartOver)
		}
		if err := k.commit(); err != nil {
			t.Fatal(err)
		}
	}
	step("a new directory reads every file, once", "c", []string{a}, false, a, a)
	step("a file added is read alone", "c", []string{b}, false, b, a)
	step("the same files again read nothing", "c", nil, false, a, b)

	write(b, "line b1\nline b2\n")
	step("a file that grew is read again", "c", []string{b}, false, a, b)

	step("another source cluster starts over", "other", []string{a, b}, true, a, b)
	step("a file no longer given starts over", "other", []string{a}, true, a)

	write(a, "rotated\n") // the same name, other first bytes, newer time
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(a, later, later); err != nil {
		t.Fatal(err)
	}
	step("a file rewritten in place starts over", "other", []string{a}, true, a)

	write(a, "r")
	if err := os.Chtimes(a, later.Add(time.Minute), later.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	step("a file that shrank starts over", "other", []string{a}, true, a)
}

func TestKeepRefusesAForeignDirectoryAndASecondReport(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(log, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := openKeep(dir, "c", []string{log})
	if err == nil || !strings.Contains(err.Error(), "is not empty and holds no report's data") {
		t.Fatalf("a directory holding other files: %v", err)
	}

	kept := filepath.Join(t.TempDir(), "kept")
	k, err := openKeep(kept, "c", []string{log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openKeep(kept, "c", []string{log}); err == nil || !strings.Contains(err.Error(), "is in use by another report") {
		t.Fatalf("a second report on a kept directory in use: %v", err)
	}
	k.unlock()
	k, err = openKeep(kept, "c", []string{log})
	if err != nil {
		t.Fatalf("after the first report: %v", err)
	}
	k.unlock()

	if err := os.WriteFile(filepath.Join(kept, manifestName), []byte("{cut"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err = openKeep(kept, "c", []string{log})
	if err != nil || !k.startOver {
		t.Fatalf("an unreadable manifest: %v, start over %v, want a start over", err, k != nil && k.startOver)
	}
	k.unlock()
}
