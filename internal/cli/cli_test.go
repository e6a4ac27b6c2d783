package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

func newSet() (*flag.FlagSet, *string, *bool) {
	fs := flag.NewFlagSet("cmd", flag.ContinueOnError)
	db := fs.String("database", "d", "a database")
	raw := fs.Bool("keep-raw", false, "keep")
	SetUsage(fs, "cmd [flags] FILE...")
	return fs, db, raw
}

func TestParse(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		max      int
		operands []string
		db       string
		code     int
		err      string
	}{
		{"flags may follow operands", []string{"a.log", "--database", "x", "b.log", "--keep-raw"}, -1, []string{"a.log", "b.log"}, "x", 0, ""},
		{"-- ends the flags", []string{"--database", "x", "--", "--keep-raw", "a.log"}, -1, []string{"--keep-raw", "a.log"}, "x", 0, ""},
		{"a stray operand is a usage error naming it", []string{"serve", "--database", "x"}, 0, nil, "", ExitUsage, `unexpected argument "serve": cmd takes no arguments (flags start with -)`},
		{"one operand too many is named", []string{"a", "b"}, 1, nil, "", ExitUsage, `unexpected argument "b": cmd takes at most 1`},
		{"an unknown flag is a usage error naming it", []string{"--bogus"}, -1, nil, "", ExitUsage, "flag provided but not defined: -bogus"},
		{"-h is help", []string{"a", "-h"}, -1, nil, "", ExitOK, flag.ErrHelp.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, db, _ := newSet()
			var help bytes.Buffer
			ops, err := Parse(fs, tt.args, tt.max, &help)
			if ExitCode(err) != tt.code {
				t.Fatalf("exit code %d (%v), want %d", ExitCode(err), err, tt.code)
			}
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(ops, tt.operands) || *db != tt.db {
				t.Fatalf("operands %q, --database %q (%v); want %q, %q", ops, *db, err, tt.operands, tt.db)
			}
		})
	}
}

func TestHelpGoesToTheHelpWriterWithTheDefaults(t *testing.T) {
	fs, _, _ := newSet()
	var help bytes.Buffer
	if _, err := Parse(fs, []string{"--help"}, -1, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"usage: cmd [flags] FILE...", "-database", `(default "d")`} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, help.String())
		}
	}
	fs, _, _ = newSet()
	help.Reset()
	if _, err := Parse(fs, []string{"--bogus"}, -1, &help); err == nil || help.Len() != 0 {
		t.Errorf("a bad flag printed %q (%v); the caller prints the error once", help.String(), err)
	}
}

func TestExitCodes(t *testing.T) {
	for err, want := range map[error]int{
		nil:                                     ExitOK,
		flag.ErrHelp:                            ExitOK,
		fmt.Errorf("wrapped: %w", flag.ErrHelp): ExitOK,
		Usagef("--top 0: want 1 or more"):       ExitUsage,
		fmt.Errorf("ctx: %w", Usage(errors.New("bad"))): ExitUsage,
		errors.New("connection refused"):                ExitRuntime,
	} {
		if got := ExitCode(err); got != want {
			t.Errorf("ExitCode(%v) = %d, want %d", err, got, want)
		}
	}
	if Usage(nil) != nil {
		t.Error("Usage(nil) is not nil")
	}
}

func TestIsHelp(t *testing.T) {
	for arg, want := range map[string]bool{"-h": true, "--help": true, "help": true, "-help": true, "report": false, "": false} {
		if IsHelp(arg) != want {
			t.Errorf("IsHelp(%q) = %v", arg, !want)
		}
	}
}

func TestDurationsAreLoggedAsText(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{ReplaceAttr: DurationsAsText}))
	log.Info("retrying", "retryIn", 1500*time.Millisecond, "group", slog.GroupValue(slog.Duration("took", time.Minute)), "n", 3)
	if got := out.String(); !strings.Contains(got, `"retryIn":"1.5s"`) || !strings.Contains(got, `"took":"1m0s"`) || !strings.Contains(got, `"n":3`) {
		t.Errorf("logged %s", got)
	}
}
func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := map[string]time.Time{
		"2h":                   now.Add(-2 * time.Hour),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"2026-11-29T08:00:00Z": time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC),
	}
	for in, want := range cases {
		if got, err := ParseTime(in, now); err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "yesterday", "-2h", "1.5d", "2026-11-29"} {
		if _, err := ParseTime(bad, now); err == nil {
			t.Errorf("ParseTime(%q) accepted", bad)
		}
	}
}
