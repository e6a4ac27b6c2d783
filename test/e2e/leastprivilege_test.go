package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
)

// TestServeWithoutDDLRights starts ClickHouse 18.16 with the users of
// docs/clickhouse-users.xml as they are: the administrator migrates, and
// `auditsink serve` stores events as stampguard_sink, which may insert and
// select but run no DDL, with --no-migrate and without it (the schema is
// current, so serve runs no DDL either way). stampguard_grafana reads the
// events and nothing else.
func TestServeWithoutDDLRights(t *testing.T) {
	bin := bintest.Build(t, "./cmd/auditsink")
	root := kubetest.RepoRoot(t)
	ch := chtest.StartWithUsers(t, filepath.Join(root, "docs", "clickhouse-users.xml"))
	dir := t.TempDir()
	admin := fmt.Sprintf("clickhouse://127.0.0.1:%d", ch.Port)
	sinkDSN := fmt.Sprintf("clickhouse://stampguard_sink:change-me-sink@127.0.0.1:%d/stampguard", ch.Port)
	runAs := func(dsn string, args ...string) (string, int) {
		_, stderr, code := runBinary(t, append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+dsn), bin, args...)
		return stderr, code
	}
	migrate := func(t *testing.T) {
		if stderr, code := runAs(admin, "migrate"); code != 0 {
			t.Fatalf("auditsink migrate as the administrator: exit %d: %s", code, stderr)
		}
	}

	batches := auditBatches(t, filepath.Join(root, "analytics", "testdata", "events.jsonl"), 5)
	adminConn := ch.Conn(t, "stampguard")
	stored := func(t *testing.T, cluster string) uint64 {
		var n uint64
		if err := adminConn.QueryRow(t.Context(), "SELECT count() FROM events_by_hour WHERE cluster = ?", cluster).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// serve starts serve as stampguard_sink, posts the batches, runs
	// meanwhile (the spool holds them), and waits until ClickHouse has them.
	serve := func(t *testing.T, cluster string, meanwhile func(*process), extra ...string) {
		t.Helper()
		addr := freeAddr(t)
		env := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+sinkDSN, "AUDITSINK_TOKEN="+sinkToken)
		p := startProcess(t, env, bin, append([]string{"serve", "--plaintext", "--listen", addr, "--metrics-listen", "",
			"--spool-dir", filepath.Join(dir, "spool-"+cluster)}, extra...)...)
		p.waitFor("the sink listening", func() error { return httpStatus(http.DefaultClient, "http://"+addr+"/healthz", http.StatusOK) })
		var want uint64
		for _, b := range batches {
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/clusters/"+cluster+"/events", bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+sinkToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var answer struct{ Accepted uint64 }
			err = json.NewDecoder(resp.Body).Decode(&answer)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || err != nil {
				t.Fatalf("a batch: HTTP %d (%v)", resp.StatusCode, err)
			}
			want += answer.Accepted
		}
		meanwhile(p)
		p.waitFor(fmt.Sprintf("%d events of cluster %s stored", want, cluster), func() error {
			if n := stored(t, cluster); n != want {
				return fmt.Errorf("%d stored", n)
			}
			return nil
		})
		if code := p.stop(); code != 0 {
			t.Fatalf("exit %d; output:\n%s", code, p.out.String())
		}
		if out := p.out.String(); strings.Contains(out, "DDL queries are prohibited") || strings.Contains(out, "schema migrated") {
			t.Errorf("serve %v ran DDL:\n%s", extra, out)
		}
	}
	t.Run("serve --no-migrate waits for the migration, then stores events as a user without DDL rights", func(t *testing.T) {
		serve(t, "nodll", func(p *process) {
			p.waitFor("serve saying it waits for the migration", func() error {
				if !strings.Contains(p.out.String(), "run auditsink migrate") {
					return errors.New("not yet")
				}
				return nil
			})
			migrate(t)
		}, "--no-migrate")
	})
	t.Run("stampguard_sink has no DDL rights", func(t *testing.T) {
		if stderr, code := runAs(sinkDSN, "migrate"); code != 1 || !strings.Contains(stderr, "DDL queries are prohibited") {
			t.Fatalf("auditsink migrate as stampguard_sink: exit %d: %s; want a refusal of the DDL", code, stderr)
		}
	})
	t.Run("serve without --no-migrate runs no DDL on a current schema", func(t *testing.T) { serve(t, "current", func(*process) {}) })

	t.Run("the Grafana user reads the events and nothing else", func(t *testing.T) {
		if err := ch.Conn(t, "default").Exec(t.Context(), "CREATE TABLE IF NOT EXISTS default.private (x UInt8) ENGINE = Memory"); err != nil {
			t.Fatal(err)
		}
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{fmt.Sprintf("127.0.0.1:%d", ch.Port)},
			Auth:        clickhouse.Auth{Database: "stampguard", Username: "stampguard_grafana", Password: "change-me-grafana"},
			DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var n uint64
		if err := conn.QueryRow(t.Context(), "SELECT count() FROM stampguard.events_by_hour").Scan(&n); err != nil || n == 0 {
			t.Fatalf("select the events: %d (%v)", n, err)
		}
		// A readonly = 1 user may "set" a setting to the value it already
		// has, so the change asked for is one more than the value in force
		// for this user, whatever the machine's default.
		var maxThreads string
		if err := conn.QueryRow(t.Context(), "SELECT value FROM system.settings WHERE name = 'max_threads'").Scan(&maxThreads); err != nil {
			t.Fatalf("read max_threads as the Grafana user: %v", err)
		}
		threads, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(maxThreads, "auto("), ")"), 10, 64)
		if err != nil {
			t.Fatalf("max_threads in force is %q: %v", maxThreads, err)
		}
		for what, q := range map[string]string{
			"an insert":                  "INSERT INTO stampguard.dead_letters SELECT * FROM stampguard.dead_letters LIMIT 0",
			"DDL":                        "CREATE TABLE stampguard.mine (x UInt8) ENGINE = Memory",
			"another database":           "SELECT count() FROM default.private",
			"a change of a setting":      fmt.Sprintf("SELECT 1 SETTINGS max_threads = %d", threads+1),
			"retention's DROP PARTITION": "ALTER TABLE stampguard.events_by_hour DROP PARTITION '2020-01-01'",
		} {
			if err := conn.Exec(t.Context(), q); err == nil {
				t.Errorf("the Grafana user ran %s: %s", what, q)
			} else if what == "a change of a setting" && !strings.Contains(err.Error(), "readonly") {
				t.Errorf("the Grafana user's change of a setting failed for another reason than readonly: %v", err)
			}
		}
	})
}
