package config

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/pipeline"
	"github.com/stampguard/stampguard/analytics/sink"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/cli"
)

// parseConfig binds a ServeConfig to a fresh flag set and parses args, as
// `auditsink serve` does.
func parseConfig(t *testing.T, args ...string) *ServeConfig {
	t.Helper()
	var c ServeConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return &c
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFlagsBeatTheEnvironment is the auditsink flag rule: an explicit
// flag beats the environment, the environment beats the defaults.
func TestFlagsBeatTheEnvironment(t *testing.T) {
	file := writeFile(t, "  clickhouse://from-file:9000\n")
	tests := []struct {
		name     string
		env      string
		args     []string
		want     string
		wantFrom string
	}{
		{"--clickhouse beats the environment", "clickhouse://from-env:9000",
			[]string{"--clickhouse", "clickhouse://from-flag:9000"}, "clickhouse://from-flag:9000", "--clickhouse"},
		{"--clickhouse-dsn-file beats the environment", "clickhouse://from-env:9000",
			[]string{"--clickhouse-dsn-file", file}, "clickhouse://from-file:9000", "--clickhouse-dsn-file " + file},
		{"the environment is used without either flag", "clickhouse://from-env:9000", nil, "clickhouse://from-env:9000", "$" + DSNEnv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(DSNEnv, tt.env)
			conn, err := parseConfig(t, tt.args...).Connect(io.Discard)
			if err != nil || conn.Store.DSN != tt.want || conn.From != tt.wantFrom {
				t.Fatalf("DSN %q from %q (%v), want %q from %q", conn.Store.DSN, conn.From, err, tt.want, tt.wantFrom)
			}
		})
	}
	t.Run("--clickhouse-cluster beats the environment, which is its default", func(t *testing.T) {
		t.Setenv(DSNEnv, "clickhouse://h:9000")
		t.Setenv(ClickHouseClusterEnv, "from_env")
		for args, want := range map[string]string{"": "from_env", "--clickhouse-cluster from_flag": "from_flag", "--clickhouse-cluster=": ""} {
			conn, err := parseConfig(t, strings.Fields(args)...).Connect(io.Discard)
			if err != nil || conn.Store.ClickHouseCluster != want {
				t.Errorf("%q: cluster %q (%v), want %q", args, conn.Store.ClickHouseCluster, err, want)
			}
		}
	})
}

func TestDSNErrorsNameWhatIsMissing(t *testing.T) {
	t.Setenv(DSNEnv, "")
	_, err := parseConfig(t).Connect(io.Discard)
	if err == nil || err.Error() != "no ClickHouse DSN: give --clickhouse, --clickhouse-dsn-file or $AUDITSINK_CLICKHOUSE_DSN" || cli.ExitCode(err) != cli.ExitUsage {
		t.Errorf("no DSN at all: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "absent")
	_, err = parseConfig(t, "--clickhouse-dsn-file", missing).Connect(io.Discard)
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "--clickhouse-dsn-file: ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing DSN file: %v", err)
	}
	_, err = parseConfig(t, "--clickhouse-dsn-file", writeFile(t, "clickhouse://a:9000"), "--clickhouse", "clickhouse://b:9000").Connect(io.Discard)
	if err == nil || err.Error() != "give --clickhouse or --clickhouse-dsn-file, not both" {
		t.Errorf("both DSN flags: %v", err)
	}
	_, err = parseConfig(t, "--clickhouse", "clickhouse://b:9000", "--database", "").Connect(io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "--database is empty") {
		t.Errorf("--database '': %v", err)
	}
}

func TestADSNWithAPasswordOnTheCommandLineIsWarnedAbout(t *testing.T) {
	t.Setenv(DSNEnv, "")
	for dsn, warned := range map[string]bool{
		"clickhouse://user:secret@127.0.0.1:9000": true,
		"clickhouse://127.0.0.1:9000":             false,
		"clickhouse://user@127.0.0.1:9000":        false, // a user, no password
		"clickhouse://user:@127.0.0.1:9000":       true,  // an empty one: still on the command line
	} {
		var logs bytes.Buffer
		if _, err := parseConfig(t, "--clickhouse", dsn).Connect(&logs); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "holds a password that other users can read"); got != warned {
			t.Errorf("%s: warned %v, want %v (%q)", dsn, got, warned, logs.String())
		}
	}
}

func TestStoreOptionsCarryTheSharedFlags(t *testing.T) {
	t.Setenv(DSNEnv, "")
	t.Setenv(ClickHouseClusterEnv, "from_env")
	conn, err := parseConfig(t, "--clickhouse", "clickhouse://h:9000", "--keep-raw").Connect(io.Discard)
	want := store.Options{DSN: "clickhouse://h:9000", Database: "stampguard", KeepRaw: true, ClickHouseCluster: "from_env"}
	if err != nil || conn.Store != want {
		t.Errorf("defaults: %+v (%v), want %+v", conn, err, want)
	}
	conn, err = parseConfig(t, "--clickhouse", "clickhouse://h:9000", "--database", "db", "--clickhouse-cluster", "flag").Connect(io.Discard)
	want = store.Options{DSN: "clickhouse://h:9000", Database: "db", ClickHouseCluster: "flag"}
	if err != nil || conn.Store != want {
		t.Errorf("flags: %+v (%v), want %+v", conn, err, want)
	}
}

// resolve parses args as `auditsink serve --plaintext` does and
// resolves them.
func resolve(t *testing.T, args ...string) (sink.Options, error) {
	t.Helper()
	s, err := parseConfig(t, append([]string{"--plaintext"}, args...)...).Resolve(io.Discard)
	if err != nil {
		return sink.Options{}, err
	}
	return s.Options, nil
}

func TestTokenPrecedence(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	const fromFile, fromEnv = "from-file-0123456789abcdef0123456789", "from-env-0123456789abcdef0123456789"
	t.Setenv(TokenEnv, fromEnv+"\n") // trimmed as the file is
	o, err := resolve(t, "--token-file", writeFile(t, fromFile+"\n"))
	if err != nil || o.Token != fromFile {
		t.Errorf("token file and env: %q (%v), want the file's", o.Token, err)
	}
	o, err = resolve(t)
	if err != nil || o.Token != fromEnv {
		t.Errorf("env only: %q (%v), want the env's, trimmed", o.Token, err)
	}
	missing := filepath.Join(t.TempDir(), "absent")
	_, err = resolve(t, "--token-file", missing)
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "--token-file: read token file: ") {
		t.Errorf("missing token file: %v", err)
	}
}

func TestResolveServeDefaults(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	t.Setenv(TokenEnv, "")
	o, err := resolve(t, "--allow-unauthenticated")
	if err != nil {
		t.Fatal(err)
	}
	if o.Listen != ":8443" || o.MetricsListen != ":9090" || o.SpoolDir != "/var/lib/auditsink/spool" ||
		o.SpoolMaxBytes != 1<<30 || o.MaxBodyBytes != 1<<30 || o.MaxEventBytes != audit.DefaultMaxEventBytes ||
		o.Retention != 0 || o.InsertParallel != 2 || o.ShutdownTimeout != sink.DefaultShutdownTimeout ||
		o.Cluster != sink.DefaultCluster || !reflect.DeepEqual(o.Stages, audit.DefaultStages) || o.RedactResources != nil ||
		!o.Plaintext || !o.AllowUnauthenticated || o.Token != "" || o.Logger == nil {
		t.Errorf("defaults resolved to %+v", o)
	}
	o, err = resolve(t, "--allow-unauthenticated", "--cluster", "prod", "--stages", " ResponseComplete, ,Panic,RequestReceived ",
		"--redact-resources", "configmaps,", "--spool-max", "512MiB", "--max-body", "4096", "--retention", "30d")
	if err != nil {
		t.Fatal(err)
	}
	if o.Cluster != "prod" || !reflect.DeepEqual(o.Stages, []string{"ResponseComplete", "Panic", "RequestReceived"}) ||
		!reflect.DeepEqual(o.RedactResources, []string{"configmaps"}) || o.SpoolMaxBytes != 512<<20 || o.MaxBodyBytes != 4096 ||
		o.Retention != 30*24*time.Hour {
		t.Errorf("flags resolved to %+v", o)
	}
}

func TestResolveErrorsNameTheFlag(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	t.Setenv(TokenEnv, strings.Repeat("t", MinTokenLength))
	for args, want := range map[string]string{
		"--spool-max 1XB":                  `--spool-max: size "1XB": want a positive number with an optional KiB, MiB, GiB or TiB`,
		"--max-body 0":                     `--max-body: size "0": want a positive number with an optional KiB, MiB, GiB or TiB`,
		"--retention xd":                   `--retention "xd": want a number of days such as 30d`,
		"--retention soon":                 `--retention "soon": want 30d or a duration`,
		"--insert-parallel 0":              `--insert-parallel 0: want 1 or more`,
		"--shutdown-timeout 0s":            `--shutdown-timeout 0s: want a positive duration`,
		"--cluster ..bad":                  `--cluster "..bad": want letters, digits, '-', '_' and '.', starting with a letter or digit, at most 63`,
		"--stages ,":                       `--stages is empty: name the audit stages to store (default ResponseComplete,Panic)`,
		"--client-ca ca.pem":               `--client-ca needs TLS: drop --plaintext and give --tls-cert and --tls-key`,
		"--log-level loud":                 `--log-level "loud": want debug, info, warn or error`,
		"--memory-limit lots":              `--memory-limit: size "lots": want a positive number with an optional KiB, MiB, GiB or TiB`,
		"--tls-cert c.pem --tls-key k.pem": `give --tls-cert and --tls-key, or --plaintext, not both`,
	} {
		_, err := resolve(t, strings.Fields(args)...)
		if err == nil || err.Error() != want || cli.ExitCode(err) != cli.ExitUsage {
			t.Errorf("%s: %v, want the usage error %q", args, err, want)
		}
	}
	t.Setenv(TokenEnv, "")
	_, err := resolve(t)
	if want := "no authentication configured: give --token-file (or $AUDITSINK_TOKEN), --client-ca, or --allow-unauthenticated"; err == nil || err.Error() != want {
		t.Errorf("no credentials: %v, want %q", err, want)
	}
	s, err := parseConfig(t, "--allow-unauthenticated").Resolve(io.Discard)
	if want := "TLS needs --tls-cert and --tls-key (or --plaintext for plain HTTP)"; err == nil || err.Error() != want {
		t.Errorf("no TLS and no --plaintext: %+v %v, want %q", s, err, want)
	}
	missing := filepath.Join(t.TempDir(), "absent.pem")
	_, err = parseConfig(t, "--allow-unauthenticated", "--tls-cert", missing, "--tls-key", missing).Resolve(io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "--tls-cert: ") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing --tls-cert: %v", err)
	}
}

func TestPipelineOptionsShareTheAccepter(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	args := []string{"--stages", "Panic", "--redact-resources", "configmaps", "--keep-raw"}
	history := audit.NewFieldHasher(nil) // the field history is on, with no key file: the empty key
	want := &pipeline.Accepter{Decoder: audit.Decoder{RedactResources: []string{"configmaps"}, KeepRaw: true, History: &history}, Stages: []string{"Panic"}}
	file := writeFile(t, "{}\n")

	var ic IngestConfig
	parseInto(t, &ic, args...)
	in, err := ic.Resolve([]string{file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if in.Options.Cluster != sink.DefaultCluster || !reflect.DeepEqual(in.Options.Accepter, want) || in.Options.Logger == nil || !in.Store.KeepRaw {
		t.Errorf("ingest options %+v", in.Options)
	}
	var tc TailConfig
	parseInto(t, &tc, append(args, "--checkpoint", "cp")...)
	to, err := tc.Resolve([]string{file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if to.Options.Cluster != sink.DefaultCluster || !reflect.DeepEqual(to.Options.Accepter, want) || to.Options.CheckpointPath != "cp" || to.Options.Logger == nil {
		t.Errorf("tail options %+v", to.Options)
	}
	var tc2 TailConfig
	parseInto(t, &tc2)
	if to, err := tc2.Resolve([]string{file}, io.Discard); err != nil || to.Options.CheckpointPath != file+".auditsink-checkpoint" {
		t.Errorf("tail's default checkpoint: %+v (%v)", to, err)
	}
	// A log that does not exist yet is followed from its first appearance,
	// and the command says so.
	notYet := filepath.Join(t.TempDir(), "audit.log")
	var logs bytes.Buffer
	if _, err := tc2.Resolve([]string{notYet}, &logs); err != nil || !strings.Contains(logs.String(), "the audit log does not exist yet") {
		t.Errorf("tail of a log not there yet: %v, logged %q", err, logs.String())
	}
}

func parseInto(t *testing.T, c interface{ Register(*flag.FlagSet) }, args ...string) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
}

// Bad values are refused before anything is touched, naming the flag or
// the file, rather than replaced by a default.
func TestSubcommandsRefuseBadValues(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	missing := filepath.Join(t.TempDir(), "absent.log")
	logFile := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(logFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"report --top 0", func() error { return reportErr(t, now, "--top", "0") }, "--top 0: want 1 or more rows per list"},
		{"report --loop-threshold 0", func() error { return reportErr(t, now, "--loop-threshold", "0") }, "--loop-threshold 0: want 2 or more conflicts (one conflict is no loop)"},
		{"report --loop-gap 0s", func() error { return reportErr(t, now, "--loop-gap", "0s") }, "--loop-gap 0s: want a positive duration"},
		{"report --format yaml", func() error { return reportErr(t, now, "--format", "yaml") }, `--format "yaml": want table or json`},
		{"report --since after --until", func() error { return reportErr(t, now, "--since", "1h", "--until", "2h") }, "--since 2026-12-01T11:00:00Z is not before --until 2026-12-01T10:00:00Z: the window is empty"},
		{"report FILE --clickhouse", func() error {
			return reportFilesErr(t, now, []string{"--clickhouse", "clickhouse://h:9000"}, logFile)
		}, "give audit log FILEs or a ClickHouse server (--clickhouse, --clickhouse-dsn-file), not both"},
		{"report FILE --database", func() error { return reportFilesErr(t, now, []string{"--database", "other"}, logFile) },
			"--database names a database on a ClickHouse server; a report from FILEs has its own"},
		{"report --keep without FILE", func() error { return reportErr(t, now, "--keep", t.TempDir()) },
			"--chdb and --keep are for a report from FILEs, and none is given"},
		{"report FILE --keep FILE", func() error { return reportFilesErr(t, now, []string{"--keep", logFile}, logFile) },
			"--keep " + logFile + " is not a directory"},
		{"report a missing FILE", func() error { return reportFilesErr(t, now, nil, missing) }, "open " + missing + ": no such file or directory"},
		{"migrate --retention 0d", func() error {
			var m MigrateConfig
			parseInto(t, &m, "--retention", "0d")
			_, err := m.Resolve(io.Discard)
			return err
		}, `--retention "0d": want a number of days such as 30d`},
		{"migrate --prune-after -1h", func() error {
			var m MigrateConfig
			parseInto(t, &m, "--prune-after", "-1h")
			_, err := m.Resolve(io.Discard)
			return err
		}, `--prune-after -1h0m0s: negative`},
		{"ingest of a missing file", func() error {
			var c IngestConfig
			parseInto(t, &c)
			_, err := c.Resolve([]string{missing}, io.Discard)
			return err
		}, "open " + missing + ": no such file or directory"},
		{"ingest of no file", func() error {
			var c IngestConfig
			parseInto(t, &c)
			_, err := c.Resolve(nil, io.Discard)
			return err
		}, "no FILE given: auditsink ingest [flags] FILE..."},
		{"tail of a file in a missing directory", func() error {
			var c TailConfig
			parseInto(t, &c)
			_, err := c.Resolve([]string{filepath.Join(missing, "audit.log")}, io.Discard)
			return err
		}, "PATH: directory stat " + missing + ": no such file or directory"},
		{"tail with a --checkpoint in a missing directory", func() error {
			var c TailConfig
			parseInto(t, &c, "--checkpoint", filepath.Join(missing, "cp"))
			_, err := c.Resolve([]string{missing}, io.Discard)
			return err
		}, "--checkpoint: directory stat " + missing + ": no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err()
			if err == nil || err.Error() != tt.want || cli.ExitCode(err) != cli.ExitUsage {
				t.Errorf("%v, want the usage error %q", err, tt.want)
			}
		})
	}
}

func reportFilesErr(t *testing.T, now time.Time, args []string, files ...string) error {
	var r ReportConfig
	parseInto(t, &r, args...)
	_, err := r.Resolve(files, now, io.Discard)
	return err
}

func reportErr(t *testing.T, now time.Time, args ...string) error {
	var r ReportConfig
	parseInto(t, &r, args...)
	_, err := r.Resolve(nil, now, io.Discard)
	return err
}

func TestParseFlagValues(t *testing.T) {
	tests := []struct {
		name string
		got  func() (int64, error)
		want int64
	}{
		{"30d is thirty days", func() (int64, error) { d, err := ParseRetention("30d"); return int64(d), err }, int64(30 * 24 * time.Hour)},
		{"a Go duration is accepted as retention", func() (int64, error) { d, err := ParseRetention("36h"); return int64(d), err }, int64(36 * time.Hour)},
		{"1GiB is 2^30 bytes", func() (int64, error) { return ParseBytes("1GiB") }, 1 << 30},
		{"a plain number is bytes", func() (int64, error) { return ParseBytes("4096") }, 4096},
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
		if _, err := ParseRetention(bad); err == nil {
			t.Errorf("retention %q accepted", bad)
		}
	}
}

func TestServeRefusesWeakOrContradictoryCredentials(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	long := strings.Repeat("x", MinTokenLength)
	for _, c := range []struct {
		name, env string
		args      []string
		flag      string
	}{
		{"a short token from the environment", "short", nil, "$" + TokenEnv},
		{"a short token file", "", []string{"--token-file", writeFile(t, "short\n")}, "--token-file"},
		{"a token with --allow-unauthenticated", long, []string{"--allow-unauthenticated"}, "--allow-unauthenticated"},
		{"a client CA with --allow-unauthenticated", "", []string{"--client-ca", "ca.pem", "--client-names", "a", "--allow-unauthenticated"}, "--allow-unauthenticated"},
		{"a client CA without names", long, []string{"--client-ca", "ca.pem"}, "--client-ca"},
		{"names without a client CA", long, []string{"--client-names", "kube-apiserver"}, "--client-names"},
		{"token clusters without a token", "", []string{"--token-clusters", "prod", "--allow-unauthenticated"}, "--token-clusters"},
		{"a name both bound and unbound", long, []string{"--client-ca", "ca.pem", "--client-names", "a,a=prod"}, "--client-names"},
		{"a bad cluster name", long, []string{"--client-ca", "ca.pem", "--client-names", "a=../x"}, "--client-names"},
		{"retention with --no-migrate", long, []string{"--no-migrate", "--retention", "30d"}, "--retention"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(TokenEnv, c.env)
			args := []string{"--tls-cert", writeFile(t, "cert"), "--tls-key", writeFile(t, "key")}
			ca := writeFile(t, "ca")
			for _, a := range c.args {
				if a == "ca.pem" {
					a = ca
				}
				args = append(args, a)
			}
			_, err := parseConfig(t, args...).Resolve(io.Discard)
			if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), c.flag) {
				t.Fatalf("err %v, want a usage error naming %s", err, c.flag)
			}
		})
	}
}

func TestParseClientNames(t *testing.T) {
	got, err := ParseClientNames(" kube-apiserver , apiserver-prod=prod, apiserver-prod=staging ")
	want := map[string][]string{"kube-apiserver": nil, "apiserver-prod": {"prod", "staging"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v (%v), want %v", got, err, want)
	}
	if got, err := ParseClientNames(""); got != nil || err != nil {
		t.Fatalf("empty: %v %v", got, err)
	}
}

// TestIngestProgressOnlyOnATerminal: ingest draws its progress line on
// the log stream only when that is a terminal (a character device; here
// /dev/null, which is one too) and --no-progress is not given; a stream
// redirected to a file or captured in memory gets none.
func TestIngestProgressOnlyOnATerminal(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	file := writeFile(t, "{}\n")
	tty, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	redirected, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer redirected.Close()
	tests := []struct {
		name         string
		args         []string
		w            io.Writer
		wantProgress bool
	}{
		{"a terminal gets the progress line", nil, tty, true},
		{"--no-progress silences it even on a terminal", []string{"--no-progress"}, tty, false},
		{"a stream redirected to a file gets none", nil, redirected, false},
		{"a captured stream gets none", nil, &bytes.Buffer{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c IngestConfig
			parseInto(t, &c, tt.args...)
			in, err := c.Resolve([]string{file}, tt.w)
			if err != nil {
				t.Fatal(err)
			}
			if got := in.Options.Progress != nil; got != tt.wantProgress || (got && in.Options.Progress != tt.w) {
				t.Errorf("progress to %v, want it (%v) on the log stream %v", in.Options.Progress, tt.wantProgress, tt.w)
			}
		})
	}
}
