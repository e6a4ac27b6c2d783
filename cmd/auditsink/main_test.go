package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/sink"
	"github.com/stampguard/stampguard/internal/chtest"

	"github.com/stampguard/stampguard/internal/testenv"
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
	latest := analytics.Migrations[len(analytics.Migrations)-1].Version
	if !strings.Contains(out.String(), fmt.Sprintf("schema version %d", latest)) {
		t.Errorf("migrate said %q", out.String())
	}
	out.Reset()
	t.Setenv(sink.DSNEnv, ch.DSN())
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
