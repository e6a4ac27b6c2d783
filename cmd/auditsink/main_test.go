package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/analytics/config"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/test/chtest"

	"github.com/stampguard/stampguard/test/testenv"
)

func TestMigrateAndIngestFromTheCommandLine(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	ch := chtest.Start(t)
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(ch.DSN()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"migrate", "--clickhouse-dsn-file", dsnFile, "--database", "cli"}, &out, &errb); code != 0 {
		t.Fatalf("migrate: %d %s", code, errb.String())
	}
	latest := store.Migrations[len(store.Migrations)-1].Version
	if !strings.Contains(out.String(), fmt.Sprintf("schema version %d", latest)) {
		t.Errorf("migrate said %q", out.String())
	}
	out.Reset()
	t.Setenv(config.DSNEnv, ch.DSN())
	args := []string{"ingest", "--database", "cli", "--cluster", "prod", "../../analytics/testdata/events.jsonl"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("ingest: %d %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "10 events stored") {
		t.Errorf("ingest summary %q", out.String())
	}
	out.Reset()
	if code := run(t.Context(), args, &out, &errb); code != 0 || !strings.Contains(out.String(), "10 events stored (an event stored before counts once)") {
		t.Errorf("second ingest: %d %q", code, out.String())
	}
}

// The exit-code convention in process (TestCommandLines in test/e2e runs
// the built binary through many more): help 0 on stdout, a bad command
// line 2 before anything is touched.
func TestRunExitCodes(t *testing.T) {
	t.Setenv(config.DSNEnv, "clickhouse://127.0.0.1:1")
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"-h"}, 0, "usage: auditsink <command>", ""},
		{[]string{"help"}, 0, "usage: auditsink <command>", ""},
		{[]string{"help", "tail"}, 0, "usage: auditsink tail [flags] PATH", ""},
		{[]string{"ingest", "--help"}, 0, "usage: auditsink ingest [flags] FILE...", ""},
		{nil, 2, "", "usage: auditsink <command>"},
		{[]string{"report", "--top", "0"}, 2, "", "auditsink report: --top 0: want 1 or more rows per list"},
		{[]string{"migrate", "extra"}, 2, "", `auditsink migrate: unexpected argument "extra"`},
		{[]string{"report"}, 1, "", "database stampguard on ClickHouse at 127.0.0.1:1 (DSN from $AUDITSINK_CLICKHOUSE_DSN)"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(t.Context(), tt.args, &out, &errb)
		if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errb.String(), tt.stderr) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, out.String(), errb.String(), tt.code, tt.stdout, tt.stderr)
		}
	}
}
