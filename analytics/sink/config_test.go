package sink

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics"
	"github.com/stampguard/stampguard/analytics/audit"
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

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestDSNPrecedence(t *testing.T) {
	file := writeFile(t, "  clickhouse://from-file:9000\n")
	tests := []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"the file beats the environment and the flag", "clickhouse://from-env:9000",
			[]string{"--clickhouse-dsn-file", file, "--clickhouse", "clickhouse://from-flag:9000"}, "clickhouse://from-file:9000"},
		{"the environment beats the flag", "clickhouse://from-env:9000",
			[]string{"--clickhouse", "clickhouse://from-flag:9000"}, "clickhouse://from-env:9000"},
		{"the flag is the last choice", "", []string{"--clickhouse", "clickhouse://from-flag:9000"}, "clickhouse://from-flag:9000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(DSNEnv, tt.env)
			so, err := parseConfig(t, tt.args...).StoreOptions(discard())
			if err != nil || so.DSN != tt.want {
				t.Fatalf("DSN %q (%v), want %q", so.DSN, err, tt.want)
			}
		})
	}
}

func TestDSNErrorsNameWhatIsMissing(t *testing.T) {
	t.Setenv(DSNEnv, "")
	_, err := parseConfig(t).StoreOptions(discard())
	if err == nil || err.Error() != "no ClickHouse DSN: give --clickhouse-dsn-file, $AUDITSINK_CLICKHOUSE_DSN or --clickhouse" {
		t.Errorf("no DSN at all: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "absent")
	_, err = parseConfig(t, "--clickhouse-dsn-file", missing).StoreOptions(discard())
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read DSN file: ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing DSN file: %v", err)
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
		if _, err := parseConfig(t, "--clickhouse", dsn).StoreOptions(slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "holds a password that other users can read"); got != warned {
			t.Errorf("%s: warned %v, want %v (%q)", dsn, got, warned, logs.String())
		}
	}
}

func TestStoreOptionsCarryTheSharedFlags(t *testing.T) {
	t.Setenv(DSNEnv, "")
	t.Setenv(ClickHouseClusterEnv, "from-env")
	so, err := parseConfig(t, "--clickhouse", "clickhouse://h:9000", "--keep-raw").StoreOptions(discard())
	want := analytics.StoreOptions{DSN: "clickhouse://h:9000", Database: "stampguard", KeepRaw: true, ClickHouseCluster: "from-env"}
	if err != nil || so != want {
		t.Errorf("defaults: %+v (%v), want %+v", so, err, want)
	}
	so, err = parseConfig(t, "--clickhouse", "clickhouse://h:9000", "--database", "db", "--clickhouse-cluster", "flag").StoreOptions(discard())
	want = analytics.StoreOptions{DSN: "clickhouse://h:9000", Database: "db", ClickHouseCluster: "flag"}
	if err != nil || so != want {
		t.Errorf("flags: %+v (%v), want %+v", so, err, want)
	}
}

func TestTokenPrecedence(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	const fromFile, fromEnv = "from-file-0123456789abcdef0123456789", "from-env-0123456789abcdef0123456789"
	t.Setenv(TokenEnv, fromEnv+"\n") // trimmed as the file is
	o, err := parseConfig(t, "--token-file", writeFile(t, fromFile+"\n")).Resolve(discard())
	if err != nil || o.Token != fromFile {
		t.Errorf("token file and env: %q (%v), want the file's", o.Token, err)
	}
	o, err = parseConfig(t).Resolve(discard())
	if err != nil || o.Token != fromEnv {
		t.Errorf("env only: %q (%v), want the env's, trimmed", o.Token, err)
	}
	missing := filepath.Join(t.TempDir(), "absent")
	_, err = parseConfig(t, "--token-file", missing).Resolve(discard())
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read token file: ") {
		t.Errorf("missing token file: %v", err)
	}
}

func TestResolveServeDefaults(t *testing.T) {
	t.Setenv(DSNEnv, "clickhouse://h:9000")
	t.Setenv(TokenEnv, "")
	o, err := parseConfig(t).Resolve(discard())
	if err != nil {
		t.Fatal(err)
	}
	if o.Listen != ":8443" || o.MetricsListen != ":9090" || o.SpoolDir != "/var/lib/auditsink/spool" ||
		o.SpoolMaxBytes != 1<<30 || o.MaxBodyBytes != 1<<30 || o.MaxEventBytes != audit.DefaultMaxEventBytes ||
		o.Retention != 0 || o.InsertParallel != 2 || o.ShutdownTimeout != DefaultShutdownTimeout ||
		o.Cluster != DefaultCluster || !reflect.DeepEqual(o.Stages, audit.DefaultStages) || o.RedactResources != nil ||
		o.Plaintext || o.AllowUnauthenticated || o.Token != "" || o.Logger == nil {
		t.Errorf("defaults resolved to %+v", o)
	}
	o, err = parseConfig(t, "--cluster", "prod", "--stages", " ResponseComplete, ,Panic,RequestReceived ",
		"--redact-resources", "configmaps,", "--spool-max", "512MiB", "--max-body", "4096", "--retention", "30d").Resolve(discard())
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
	for args, want := range map[string]string{
		"--spool-max 1XB":  `--spool-max: size "1XB": want a positive number with an optional KiB, MiB, GiB or TiB`,
		"--max-body 0":     `--max-body: size "0": want a positive number with an optional KiB, MiB, GiB or TiB`,
		"--retention xd":   `--retention "xd": want a number of days such as 30d`,
		"--retention soon": `--retention "soon": want 30d or a duration`,
	} {
		_, err := parseConfig(t, strings.Fields(args)...).Resolve(discard())
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
	if _, err := parseConfig(t, "--log-level", "loud").Logger(io.Discard); err == nil || !strings.HasPrefix(err.Error(), "--log-level: ") {
		t.Errorf("--log-level loud: %v", err)
	}
}

func TestPipelineOptionsShareTheAccepter(t *testing.T) {
	c := &parseConfig(t, "--stages", "Panic", "--redact-resources", "configmaps", "--keep-raw").Config
	want := &analytics.Accepter{Decoder: audit.Decoder{RedactResources: []string{"configmaps"}, KeepRaw: true}, Stages: []string{"Panic"}}
	log := discard()
	in := c.IngestOptions(log)
	if in.Cluster != DefaultCluster || !reflect.DeepEqual(in.Accepter, want) || in.Logger != log {
		t.Errorf("ingest options %+v", in)
	}
	to := c.TailOptions("cp", nil, log)
	if to.Cluster != DefaultCluster || !reflect.DeepEqual(to.Accepter, want) || to.CheckpointPath != "cp" || to.Logger != log {
		t.Errorf("tail options %+v", to)
	}
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
			_, err := parseConfig(t, c.args...).Resolve(discard())
			var fe *FlagError
			if !errors.As(err, &fe) || fe.Flag != c.flag {
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
