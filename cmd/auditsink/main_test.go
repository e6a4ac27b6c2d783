package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/internal/chtest"

	"github.com/stampguard/stampguard/internal/testenv"
)

func TestParseFlagValues(t *testing.T) {
	tests := []struct {
		name string
		got  func() (int64, error)
		want int64
	}{
		{"30d is thirty days", func() (int64, error) { d, err := parseRetention("30d"); return int64(d), err }, int64(30 * 24 * time.Hour)},
		{"a Go duration is accepted as retention", func() (int64, error) { d, err := parseRetention("36h"); return int64(d), err }, int64(36 * time.Hour)},
		{"1GiB is 2^30 bytes", func() (int64, error) { return parseBytes("1GiB") }, 1 << 30},
		{"a plain number is bytes", func() (int64, error) { return parseBytes("4096") }, 4096},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.got()
			if err != nil || got != tt.want {
				t.Fatalf("got %d (%v), want %d", got, err, tt.want)
			}
		})
	}
	for _, bad := range []string{"0d", "xd", "-1h"} {
		if _, err := parseRetention(bad); err == nil {
			t.Errorf("retention %q accepted", bad)
		}
	}
}

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
	t.Setenv(dsnEnv, ch.DSN())
	args := []string{"ingest", "--database", "cli", "--cluster", "prod", "../../analytics/testdata/events.jsonl"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("ingest: %d %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "10 events stored") {
		t.Errorf("ingest summary %q", out.String())
	}
	out.Reset()
	if code := run(t.Context(), args, &out, &errb); code != 0 || !strings.Contains(out.String(), "0 events stored, 10 already stored") {
		t.Errorf("second ingest: %d %q", code, out.String())
	}
}
