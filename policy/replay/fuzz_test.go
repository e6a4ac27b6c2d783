package replay

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/logfile"
)

// FuzzReplayLog feeds arbitrary bytes to the replay's log reader as an
// audit log file (plain or gzip): it must never panic, every line is either
// replayed or counted as skipped, and a line that parses once parses the
// same way again.
func FuzzReplayLog(f *testing.F) {
	seeds := []string{
		ev{id: "a", verb: "create", user: "alice", code: 201, req: deploy("", 3, "a"), resp: deploy("10", 3, "a"), sec: 1}.line(),
		ev{id: "b", verb: "update", user: "alice", refRV: "10", code: 200, req: deploy("10", 5, "a"), resp: deploy("11", 5, "a"), sec: 2}.line(),
		ev{id: "c", verb: "patch", user: "bob", code: 403, req: `[{"op":"replace","path":"/metadata/resourceVersion","value":""}]`, sec: 3}.line(),
		ev{id: "d", level: "Metadata", verb: "delete", user: "bob", code: 200, sec: 4}.line(),
		`{"auditID":"x","stage":"ResponseComplete","stageTimestamp":"2026-12-01T10:00:00Z","verb":"update","objectRef":{"resource":"deployments","apiGroup":"apps","subresource":"scale","namespace":"shop","name":"web"},"responseStatus":{"code":200},"annotations":{"fields.stampguard.dev/field-owner":"[{\"policy\":\"p\"}]"}}`,
		"", "{}", "[", `{"stage":1}`,
	}
	if b, err := os.ReadFile("../../analytics/testdata/events.jsonl"); err == nil {
		seeds = append(seeds, strings.Split(strings.TrimSpace(string(b)), "\n")...)
	}
	for _, s := range seeds {
		f.Add([]byte(s + "\n" + s))
	}
	// One Replayer, emptied for each input: New compiles the
	// configurations' CEL, which would dominate every run.
	base, err := New(Options{Policies: testSet(f)})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := base
		r.reset()
		lr, err := logfile.NewReader(bytes.NewReader(data), logfile.ReaderOptions{MaxLineBytes: 1 << 16})
		if err != nil {
			return // a damaged gzip header: the reader says so
		}
		if err := r.Lines(t.Context(), lr); err != nil && !strings.Contains(err.Error(), "read audit log") {
			t.Fatalf("Lines: %v", err)
		}
		rep := r.Report()
		if rep.Events+rep.Skipped < rep.Writes {
			t.Fatalf("%d writes from %d events", rep.Writes, rep.Events)
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			var a, b event
			errA, errB := parseEvent(line, &a), parseEvent(line, &b)
			if (errA == nil) != (errB == nil) || a.AuditID != b.AuditID || a.Code != b.Code {
				t.Fatalf("parseEvent is not deterministic on %q", line)
			}
		}
	})
}
