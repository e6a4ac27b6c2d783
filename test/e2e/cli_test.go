package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
)

// cliCase is one command line of the built binaries and what it must do.
type cliCase struct {
	name   string
	bin    string
	args   []string
	env    []string // added to a bare environment (PATH, HOME)
	code   int
	stdout []string // substrings of stdout
	stderr []string // substrings of stderr
	absent []string // substrings stdout and stderr must not hold
	// db is the ClickHouse database the command names; unless the case
	// expects it created, it must not exist afterwards.
	db      string
	created bool
}

// TestCommandLines runs the built webhook and auditsink as an operator's
// first hour does: -h on every command, unknown flags, stray words, each
// class of bad value, missing files, a closed port and a port that is not
// ClickHouse. Each case asserts the exit code (2 for the command line, 1
// for a failure while running, 0 for help), that the message names the
// flag or file at fault, and that nothing was created in ClickHouse when
// the command line was refused.
func TestCommandLines(t *testing.T) {
	webhook := bintest.Build(t, "./cmd/webhook")
	auditsink := bintest.Build(t, "./cmd/auditsink")
	ch := chtest.Start(t)
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	events := filepath.Join(root, "analytics", "testdata", "events.jsonl")
	policies := filepath.Join(root, "examples", "policies.yaml")
	missing := filepath.Join(dir, "absent.log")
	emptyPolicies := write("empty.yaml", "# no policy here\n")
	badPolicies := write("bad.yaml", "apiVersion: stampguard.dev/v1alpha1\nkind: ConcurrencyPolicy\nmetadata: {name: p}\nspec:\n  action: Sometimes\n")
	certs := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	write("certs/tls.crt", "not read before the server starts")
	write("certs/tls.key", "not read before the server starts")
	dsnFile := write("dsn", ch.DSN()+"\n")
	closed := closedPort(t)
	garbage := notClickHouse(t)
	chEnv := "AUDITSINK_CLICKHOUSE_DSN=" + ch.DSN()

	var cases []cliCase
	add := func(c cliCase) { cases = append(cases, c) }
	// The database an auditsink case names: one per case, so that a
	// database left behind is the case's own.
	n := 0
	sink := func(name string, code int, args []string, stderr ...string) cliCase {
		n++
		db := fmt.Sprintf("cli_case_%d", n)
		return cliCase{name: name, bin: auditsink, env: []string{chEnv}, code: code, db: db,
			args: append([]string{args[0], "--database", db}, args[1:]...), stderr: stderr}
	}

	// Help, from the top and for every subcommand: stdout, exit 0.
	for _, h := range []string{"-h", "--help", "help"} {
		add(cliCase{name: "auditsink " + h + " lists the commands", bin: auditsink, args: []string{h}, code: 0,
			stdout: []string{"usage: auditsink <command>", "serve", "ingest", "tail", "migrate", "report", "Exit codes: 0 done, 2 a bad command line"}})
		add(cliCase{name: "webhook " + h + " lists the flags", bin: webhook, args: []string{h}, code: 0,
			stdout: []string{"usage: webhook [flags]", "webhook configurations", "-policy-file", "-kubeconfig", "-max-review-bytes", "(default 8388608)", "(default 9443)", "(default 25s)"}})
	}
	add(cliCase{name: "auditsink help report prints report's flags", bin: auditsink, args: []string{"help", "report"}, code: 0,
		stdout: []string{"usage: auditsink report [flags]", "-top"}})
	shared := []string{"-clickhouse DSN", "-clickhouse-dsn-file file", "-database", `(default "stampguard")`, "-log-level"}
	writers := []string{"  -stages", "  -keep-raw", "  -redact-resources", "  -cluster name"}
	for _, h := range []struct {
		cmd, usage   string
		extra, never []string
	}{
		{"serve", "usage: auditsink serve [flags]", append([]string{"-plaintext", "-token-file", "-client-ca", "-allow-unauthenticated", `(default ":8443")`}, writers...), nil},
		{"ingest", "usage: auditsink ingest [flags] FILE...", append([]string{"-no-progress", `(default "200MiB")`}, writers...), []string{"-plaintext"}},
		{"tail", "usage: auditsink tail [flags] PATH", append([]string{"-checkpoint", "(default PATH.auditsink-checkpoint)"}, writers...), []string{"-plaintext"}},
		{"migrate", "usage: auditsink migrate [flags]", []string{"-retention", "-compact", "(default true)", "-prune-after", "(default 1h0m0s)"}, writers},
		{"report", "usage: auditsink report [flags]", []string{"-top", "(default 10)", "-cluster name", `(default "default")`, "-loop-threshold", "(default 5)"}, writers[:3]},
	} {
		add(cliCase{name: "auditsink " + h.cmd + " -h prints only the flags it uses, with their defaults", bin: auditsink, args: []string{h.cmd, "-h"}, code: 0,
			stdout: append(append([]string{h.usage}, shared...), h.extra...), absent: h.never})
	}
	add(cliCase{name: "webhook configurations -h prints its flags", bin: webhook, args: []string{"configurations", "-h"}, code: 0,
		stdout: []string{"usage: webhook configurations", "-url", "-service", "-ca-bundle", "-stamp-failure-policy", "-fields-failure-policy", "-resources", "-break-glass-group"}})

	// Unknown commands, flags and stray words: 2.
	add(cliCase{name: "auditsink without a command prints the usage", bin: auditsink, code: 2, stderr: []string{"usage: auditsink <command>"}})
	add(cliCase{name: "auditsink bogus names the command", bin: auditsink, args: []string{"bogus"}, code: 2, stderr: []string{`unknown command "bogus"`}})
	for _, cmd := range []string{"serve", "ingest", "tail", "migrate", "report"} {
		add(sink("auditsink "+cmd+" --bogus names the flag", 2, []string{cmd, "--bogus"}, "flag provided but not defined: -bogus", "Run 'auditsink "+cmd+" -h'"))
	}
	for _, cmd := range []string{"serve", "migrate"} {
		add(sink("auditsink "+cmd+" refuses a stray word", 2, []string{cmd, "stray"}, `unexpected argument "stray": auditsink `+cmd+" takes no arguments"))
	}
	// report takes FILEs: a stray word is a file that is not there.
	add(sink("auditsink report names a missing FILE", 2, []string{"report", "stray"}, "open stray: no such file or directory"))
	add(sink("auditsink tail refuses a second PATH", 2, []string{"tail", events, "stray"}, `unexpected argument "stray": auditsink tail takes at most 1`))
	add(sink("auditsink tail needs a PATH", 2, []string{"tail"}, "give one PATH: auditsink tail [flags] PATH"))
	add(sink("auditsink ingest needs a FILE", 2, []string{"ingest"}, "no FILE given: auditsink ingest [flags] FILE..."))
	add(cliCase{name: "webhook --bogus names the flag", bin: webhook, args: []string{"--bogus"}, code: 2, stderr: []string{"flag provided but not defined: -bogus"}})
	add(cliCase{name: "webhook serve --policy-file refuses the stray word instead of dropping the flags after it", bin: webhook,
		args: []string{"serve", "--policy-file", policies}, code: 2, stderr: []string{`unexpected argument "serve": webhook takes no arguments`}})
	add(cliCase{name: "webhook configurations --bogus names the flag", bin: webhook, args: []string{"configurations", "--bogus"}, code: 2, stderr: []string{"flag provided but not defined: -bogus"}})
	add(cliCase{name: "webhook configurations refuses a stray word", bin: webhook, args: []string{"configurations", "--service", "a/b", "stray"}, code: 2, stderr: []string{`unexpected argument "stray"`}})

	// Bad values: 2, naming the flag; none replaced by a default.
	for _, c := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{"report --top 0", []string{"report", "--top", "0"}, "--top 0: want 1 or more"},
		{"report --loop-threshold 0", []string{"report", "--loop-threshold", "0"}, "--loop-threshold 0: want 2 or more"},
		{"report --loop-gap 0s", []string{"report", "--loop-gap", "0s"}, "--loop-gap 0s: want a positive duration"},
		{"report --fight-handoffs 1", []string{"report", "--fight-handoffs", "1"}, "--fight-handoffs 1: want 2 or more"},
		{"serve --lost-updates-window 0s", []string{"serve", "--plaintext", "--allow-unauthenticated", "--lost-updates-window", "0s"}, "--lost-updates-window 0s: want a positive duration"},
		{"report --format yaml", []string{"report", "--format", "yaml"}, `--format "yaml": want table or json`},
		{"report --since soon", []string{"report", "--since", "soon"}, "--since: "},
		{"report --top x", []string{"report", "--top", "x"}, `invalid value "x" for flag -top`},
		{"report --cluster ..bad", []string{"report", "--cluster", "..bad"}, `--cluster "..bad"`},
		{"migrate --retention 0d", []string{"migrate", "--retention", "0d"}, `--retention "0d": want a number of days such as 30d`},
		{"migrate --retention soon", []string{"migrate", "--retention", "soon"}, `--retention "soon"`},
		{"migrate --prune-after -1h", []string{"migrate", "--prune-after", "-1h"}, `--prune-after -1h0m0s: negative`},
		{"ingest --cluster ..bad", []string{"ingest", "--cluster", "..bad", events}, `--cluster "..bad"`},
		{"ingest --stages ,", []string{"ingest", "--stages", ",", events}, "--stages is empty"},
		{"ingest --memory-limit lots", []string{"ingest", "--memory-limit", "lots", events}, "--memory-limit: "},
		{"tail --log-level loud", []string{"tail", "--log-level", "loud", events}, `--log-level "loud"`},
		{"migrate --clickhouse-cluster a-b", []string{"migrate", "--clickhouse-cluster", "a-b"}, `ClickHouse cluster name "a-b"`},
		{"migrate --clickhouse http://", []string{"migrate", "--clickhouse", "http://127.0.0.1:8123"}, "--clickhouse: ClickHouse DSN: use the native protocol"},
		{"migrate --clickhouse and --clickhouse-dsn-file", []string{"migrate", "--clickhouse", ch.DSN(), "--clickhouse-dsn-file", dsnFile}, "give --clickhouse or --clickhouse-dsn-file, not both"},
		{"serve --spool-max 0", []string{"serve", "--plaintext", "--allow-unauthenticated", "--spool-max", "0"}, `--spool-max: size "0"`},
		{"serve --insert-parallel 0", []string{"serve", "--plaintext", "--allow-unauthenticated", "--insert-parallel", "0"}, "--insert-parallel 0: want 1 or more"},
		{"serve --retention 0d", []string{"serve", "--plaintext", "--allow-unauthenticated", "--retention", "0d"}, `--retention "0d"`},
		{"serve without TLS or --plaintext", []string{"serve", "--allow-unauthenticated"}, "TLS needs --tls-cert and --tls-key (or --plaintext for plain HTTP)"},
		{"serve without credentials", []string{"serve", "--plaintext"}, "give --token-file (or $AUDITSINK_TOKEN), --client-ca, or --allow-unauthenticated"},
		{"serve --plaintext --client-ca", []string{"serve", "--plaintext", "--client-ca", events}, "--client-ca needs TLS: drop --plaintext"},
	} {
		add(sink("auditsink "+c.name+" is refused naming the flag", 2, c.args, c.stderr))
	}
	for _, db := range []string{"", "a;b"} {
		add(cliCase{name: fmt.Sprintf("auditsink migrate --database %q is refused", db), bin: auditsink, env: []string{chEnv},
			args: []string{"migrate", "--database", db}, code: 2, stderr: []string{"--database"}})
	}
	add(cliCase{name: "auditsink report without any DSN names the three ways to give one", bin: auditsink, args: []string{"report"}, code: 2,
		stderr: []string{"no ClickHouse DSN: give --clickhouse, --clickhouse-dsn-file or $AUDITSINK_CLICKHOUSE_DSN"}})
	certFlags := []string{"--cert-dir", certs}
	for _, c := range []struct {
		name   string
		args   []string
		env    []string
		stderr []string
	}{
		{"--port 0", []string{"--policy-file", policies, "--port", "0"}, nil, []string{"--port 0: want 1 to 65535"}},
		{"--max-review-bytes 0", []string{"--policy-file", policies, "--max-review-bytes", "0"}, nil, []string{"--max-review-bytes 0"}},
		{"--shutdown-timeout 0s", []string{"--policy-file", policies, "--shutdown-timeout", "0s"}, nil, []string{"--shutdown-timeout 0s"}},
		{"--log-format xml", []string{"--policy-file", policies, "--log-format", "xml"}, nil, []string{`--log-format "xml"`}},
		{"an empty policy file", []string{"--policy-file", emptyPolicies}, nil, []string{"--policy-file " + emptyPolicies + " holds no policies"}},
		{"a bad policy file", []string{"--policy-file", badPolicies}, nil, []string{"--policy-file: ", badPolicies, "Sometimes"}},
		{"--sync-resources without --sync-configurations", []string{"--policy-file", policies, "--sync-resources", "configmaps"}, nil, []string{"--sync-resources needs --sync-configurations NAME"}},
		{"--policy-file with --sync-configurations", []string{"--policy-file", policies, "--sync-configurations", "stampguard"}, nil, []string{"--policy-file is file mode"}},
		{"no cluster and no --policy-file", nil, nil, []string{"no cluster to read policies from", "--kubeconfig", "--policy-file"}},
		{"a missing --kubeconfig", []string{"--kubeconfig", missing}, nil, []string{"--kubeconfig " + missing}},
		{"a missing $KUBECONFIG", nil, []string{"KUBECONFIG=" + missing}, []string{"$KUBECONFIG " + missing}},
	} {
		add(cliCase{name: "webhook " + c.name + " is refused naming the flag", bin: webhook, env: c.env, args: append(append([]string{}, certFlags...), c.args...),
			code: 2, stderr: c.stderr})
	}
	add(cliCase{name: "webhook configurations refuses a bad failure policy by name", bin: webhook,
		args: []string{"configurations", "--url", "https://127.0.0.1:9443", "--stamp-failure-policy", "Sometimes"}, code: 2,
		stderr: []string{`invalid value "Sometimes" for flag -stamp-failure-policy: want Fail or Ignore`}})
	add(cliCase{name: "webhook configurations says it needs --url or --service", bin: webhook, args: []string{"configurations"}, code: 2,
		stderr: []string{"give a URL (--url) or a Service (--service)"}})
	add(cliCase{name: "webhook configurations refuses a bad policy file with 2, as the webhook does", bin: webhook,
		args: []string{"configurations", "--service", "a/b", "--policy-file", badPolicies}, code: 2, stderr: []string{badPolicies, "Sometimes"}})

	// Missing files: 2, naming the file.
	add(sink("auditsink ingest of a missing file names it", 2, []string{"ingest", events, missing}, missing, "no such file"))
	add(sink("auditsink ingest of a directory names it", 2, []string{"ingest", dir}, dir+" is a directory"))
	add(sink("auditsink tail of a file in a missing directory names it", 2, []string{"tail", filepath.Join(missing, "audit.log")}, "PATH: directory stat "+missing, "no such file"))
	add(sink("auditsink tail with a --checkpoint in a missing directory names it", 2, []string{"tail", "--checkpoint", filepath.Join(missing, "cp"), events}, "--checkpoint: directory stat "+missing))
	add(sink("auditsink migrate with a missing --clickhouse-dsn-file names it", 2, []string{"migrate", "--clickhouse-dsn-file", missing}, "--clickhouse-dsn-file: ", missing))
	add(sink("auditsink serve with a missing --tls-cert names it", 2, []string{"serve", "--allow-unauthenticated", "--tls-cert", missing, "--tls-key", missing}, "--tls-cert: ", missing))
	add(sink("auditsink serve with a missing --token-file names it", 2, []string{"serve", "--plaintext", "--token-file", missing}, "--token-file: ", missing))
	add(cliCase{name: "webhook with a missing --policy-file names it", bin: webhook, args: append(append([]string{}, certFlags...), "--policy-file", missing),
		code: 2, stderr: []string{"--policy-file: ", missing}})
	add(cliCase{name: "webhook with a --cert-dir without tls.crt names it", bin: webhook, args: []string{"--cert-dir", dir, "--policy-file", policies},
		code: 2, stderr: []string{"--cert-dir: ", filepath.Join(dir, "tls.crt")}})

	// A server that is not there, or not ClickHouse: 1, naming the address
	// and where the DSN came from, never "no schema".
	for _, target := range []struct {
		what, addr string
		says       string
	}{{"a closed port", closed, "connection refused"}, {"a port that is not ClickHouse", garbage, "not ClickHouse's native protocol"}} {
		dsn := "clickhouse://" + target.addr
		for _, args := range [][]string{{"report"}, {"migrate"}, {"ingest", events}, {"tail", "--checkpoint", filepath.Join(dir, "cp"), events}} {
			c := sink("auditsink "+args[0]+" against "+target.what+" says so", 1, append(args, "--clickhouse", dsn),
				"ClickHouse at "+target.addr+" (DSN from --clickhouse)", target.says)
			c.absent = []string{"schema"}
			add(c)
		}
		c := sink("auditsink report against "+target.what+" from $AUDITSINK_CLICKHOUSE_DSN says so", 1, []string{"report"},
			"ClickHouse at "+target.addr+" (DSN from $AUDITSINK_CLICKHOUSE_DSN)", target.says)
		c.env = []string{"AUDITSINK_CLICKHOUSE_DSN=" + dsn}
		add(c)
	}
	// An explicit flag beats the environment: with the environment naming
	// a closed port, --clickhouse reaches the real server.
	ok := sink("auditsink migrate --clickhouse beats $AUDITSINK_CLICKHOUSE_DSN", 0, []string{"migrate", "--clickhouse", ch.DSN()})
	ok.env, ok.created, ok.stdout = []string{"AUDITSINK_CLICKHOUSE_DSN=clickhouse://" + closed}, true, []string{"at schema version"}
	add(ok)
	// A database that exists but holds no schema: that is what "no schema" is for.
	conn := ch.Conn(t, "default")
	if err := conn.Exec(t.Context(), "CREATE DATABASE cli_empty"); err != nil {
		t.Fatal(err)
	}
	add(cliCase{name: "auditsink report on a database without the schema says so", bin: auditsink, env: []string{chEnv},
		args: []string{"report", "--database", "cli_empty"}, code: 1, db: "cli_empty", created: true,
		stderr: []string{"database cli_empty on ClickHouse at", "holds no stampguard schema; check --database, or run auditsink migrate"}})

	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stdout, stderr, code := runBinary(t, append(append([]string{}, base...), c.env...), c.bin, c.args...)
			if code != c.code {
				t.Errorf("exit code %d, want %d; stdout:\n%s\nstderr:\n%s", code, c.code, stdout, stderr)
			}
			for _, want := range c.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			for _, want := range c.stderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
			for _, never := range c.absent {
				if strings.Contains(stdout, never) || strings.Contains(stderr, never) {
					t.Errorf("the output holds %q:\n%s%s", never, stdout, stderr)
				}
			}
			if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
				t.Errorf("a panic or stack trace:\n%s", stderr)
			}
			if c.db == "" {
				return
			}
			var exists uint64
			if err := conn.QueryRow(t.Context(), "SELECT count() FROM system.databases WHERE name = ?", c.db).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if (exists == 1) != c.created {
				t.Errorf("database %s exists: %v, want %v", c.db, exists == 1, c.created)
			}
		})
	}
	// Nothing else appeared either: only the databases the cases made on
	// purpose, and the server's own.
	rows, err := conn.Query(t.Context(), "SELECT name FROM system.databases WHERE name LIKE 'cli_%' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var made []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		made = append(made, name)
	}
	want := []string{ok.db, "cli_empty"}
	slices.Sort(want)
	if !slices.Equal(made, want) {
		t.Errorf("databases cli_*: %v, want only %v", made, want)
	}
}

// closedPort is a loopback address nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// notClickHouse listens on loopback and answers every connection with
// bytes that are no ClickHouse handshake, then closes it.
func notClickHouse(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\nnot ClickHouse\n"))
			c.Close()
		}
	}()
	return ln.Addr().String()
}
