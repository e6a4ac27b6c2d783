package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/analytics/pipeline"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/logfile"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/pkitest"

	"github.com/stampguard/stampguard/test/testenv"
)

// TestAuditSink runs a real apiserver with BOTH audit backends: the log
// file, and the webhook backend pointing (through a recording proxy) at
// `auditsink serve` running as a separate process. While a workload of
// creates, conflicting updates, patches, server-side apply conflicts,
// deletes, secrets and lease takeovers runs, the sink is SIGKILLed and
// restarted, ClickHouse is stopped for 30 s, and the log rotates under
// `tail`. Then, per source (webhook, tail, ingest of the files), every
// ResponseComplete audit ID of the log files is in ClickHouse exactly
// once as every read takes it; redelivering every webhook batch and
// ingesting the files again changes no count.
func TestAuditSink(t *testing.T) {
	testenv.SkipIfShort(t, "starts kube-apiserver, etcd, clickhouse-server and the sink")
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	bin := buildAuditsink(t, root, dir)

	ch := chtest.Start(t)
	const db = "e2e"
	migrate(t, ch, db)

	sinkCA := pkitest.NewCA("e2e-sink-ca")
	serving := sinkCA.Server("auditsink", "127.0.0.1")
	certFile, keyFile := serving.WriteFiles(t, dir)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("e2e-token-0123456789abcdef0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sinkAddr, metricsAddr := freeAddr(t), freeAddr(t)
	sink := &sinkProcess{t: t, bin: bin, args: []string{"serve", "--listen", sinkAddr,
		"--tls-cert", certFile, "--tls-key", keyFile, "--token-file", tokenFile,
		"--spool-dir", filepath.Join(dir, "spool"), "--metrics-listen", metricsAddr, "--database", db, "--keep-raw",
		"--log-level", "warn"},
		env: append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN()), log: filepath.Join(dir, "sink.log")}
	sink.start()
	t.Cleanup(sink.kill)

	proxy := newRecordingProxy(t, sinkCA, serving, "https://"+sinkAddr)

	policy, err := os.ReadFile(filepath.Join(root, "docs", "audit-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(t, kubetest.Options{
		AuditPolicy:        string(policy),
		AuditLog:           true,
		AuditWebhookURL:    proxy.url + "/clusters/webhook/events",
		AuditWebhookCAFile: sinkCA.WriteFile(t, dir),
		AuditWebhookToken:  "e2e-token-0123456789abcdef0123456789",
		Flags:              map[string]string{"audit-log-maxsize": "1", "audit-log-maxbackup": "100"},
	})

	// tail follows the live log into cluster "tail".
	st, err := store.Open(t.Context(), store.Options{DSN: ch.DSN(), Database: db})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tailCtx, stopTail := context.WithCancel(t.Context())
	tailDone := make(chan error, 1)
	go func() {
		tailDone <- pipeline.Tail(tailCtx, st, env.AuditLogPath, pipeline.TailOptions{Cluster: "tail",
			Accepter: &pipeline.Accepter{}, CheckpointPath: filepath.Join(dir, "tail.checkpoint"),
			FlushInterval: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	}()

	w := &workload{t: t, c: env.Client, ns: "audit-e2e"}
	w.setup()

	w.run("before any failure", 60)

	t.Log("SIGKILL the sink, keep writing, restart it")
	sink.kill()
	w.run("while the sink is dead", 30)
	sink.start()
	w.run("after the sink restarted", 30)

	t.Log("stop ClickHouse for 30s while writing")
	ch.Stop()
	stopAt := time.Now()
	for time.Since(stopAt) < 30*time.Second {
		w.run("while ClickHouse is down", 10)
		time.Sleep(time.Second)
	}
	ch.Start()
	w.run("after ClickHouse returned", 30)

	conn := ch.Conn(t, db)
	logIDs := responseCompleteIDs(t, env.AuditLogPath)
	if n := len(logFiles(t, env.AuditLogPath)); n < 2 {
		t.Errorf("the audit log did not rotate (%d files); the tail-across-rotation check is weak", n)
	}
	t.Logf("%d ResponseComplete events in %d log files", len(logIDs), len(logFiles(t, env.AuditLogPath)))

	for _, cluster := range []string{"webhook", "tail"} {
		waitStored(t, conn, cluster, logIDs)
	}
	stopTail()
	if err := <-tailDone; err != nil {
		t.Errorf("tail: %v", err)
	}

	// ingest the files (all of them, rotated too) as a third source, twice.
	// The apiserver keeps appending to the live file, so both ingests read
	// one snapshot: the second must store nothing.
	files := snapshot(t, logFiles(t, env.AuditLogPath))
	res, err := pipeline.IngestFiles(t.Context(), st, files, pipeline.IngestOptions{Cluster: "file", Accepter: &pipeline.Accepter{}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := pipeline.IngestFiles(t.Context(), st, files, pipeline.IngestOptions{Cluster: "file", Accepter: &pipeline.Accepter{}})
	if err != nil {
		t.Fatal(err)
	}
	if again.Stored != res.Stored {
		t.Errorf("second ingest: %s (first: %s): it stores the same events again, as copies every read takes once", again, res)
	}
	waitStored(t, conn, "file", logIDs)

	cutoff := time.Now().Add(-10 * time.Second) // everything older has arrived by every path
	before := rollupCounts(t, conn, cutoff)
	t.Log("deliver every webhook batch a second time")
	written0 := sinkWritten(t, metricsAddr)
	replayed := 0
	for i, body := range proxy.bodies() {
		code, answer := proxy.replay(body)
		if code != 200 {
			t.Fatalf("replaying batch %d: %d", i, code)
		}
		var a struct{ Accepted int }
		if err := json.Unmarshal(answer, &a); err != nil {
			t.Fatalf("answer %q: %v", answer, err)
		}
		replayed += a.Accepted
	}
	// The same events through the other backend: the fingerprint matches,
	// so ingesting the log into the webhook's cluster stores nothing that
	// the webhook path already stored.
	cross, err := pipeline.IngestFiles(t.Context(), st, files, pipeline.IngestOptions{Cluster: "webhook", Accepter: &pipeline.Accepter{}})
	if err != nil {
		t.Fatal(err)
	}
	// The replays went through the writer (stored or deduplicated)
	// before the counts are compared.
	eventuallyTrue(t, "the sink's writer to process the replayed batches", func() bool {
		return sinkWritten(t, metricsAddr)-written0 >= float64(replayed)
	})
	after := rollupCounts(t, conn, cutoff)
	for _, cluster := range []string{"webhook", "tail", "file"} {
		t.Run("exactly once from "+cluster, func(t *testing.T) {
			assertExactlyOnce(t, conn, cluster, env.AuditLogPath, logIDs)
		})
	}
	// A fingerprint that differed between the backends would show as a
	// second event in the exactly-once check of "webhook".
	t.Logf("ingesting the log into the webhook's cluster: %s", cross)
	for key, n := range before {
		if after[key] != n {
			t.Errorf("the count for %s changed from %d to %d after redelivery", key, n, after[key])
		}
	}
	// Secrets never land in ClickHouse.
	var leaked uint64
	if err := conn.QueryRow(t.Context(), "SELECT count() FROM events_by_hour WHERE position(raw, ?) > 0", secretValue).Scan(&leaked); err != nil {
		t.Fatal(err)
	}
	if leaked != 0 {
		t.Errorf("%d stored events contain the secret's data", leaked)
	}
	var secretEvents uint64
	if err := conn.QueryRow(t.Context(), "SELECT count() FROM events_by_hour WHERE resource = 'secrets' AND verb = 'create' AND cluster = 'webhook'").Scan(&secretEvents); err != nil {
		t.Fatal(err)
	}
	if secretEvents == 0 {
		t.Errorf("no secret create events stored: the leak check proves nothing")
	}
	// The workload's conflict shapes arrived flattened.
	for _, q := range []struct{ what, sql string }{
		{"version conflicts", "SELECT count() FROM events_by_hour WHERE cluster='webhook' AND code=409 AND reason='Conflict' AND verb='update'"},
		{"field manager conflicts", "SELECT count() FROM events_by_hour WHERE cluster='webhook' AND has(cause_reasons, 'FieldManagerConflict')"},
		{"already exists", "SELECT count() FROM events_by_hour WHERE cluster='webhook' AND reason='AlreadyExists'"},
		{"delete precondition conflicts", "SELECT count() FROM events_by_hour WHERE cluster='webhook' AND verb='delete' AND code=409"},
		{"lease holders", "SELECT count() FROM events_by_hour WHERE cluster='webhook' AND resource='leases' AND lease_holder LIKE 'e2e-holder-%'"},
	} {
		var n uint64
		if err := conn.QueryRow(t.Context(), q.sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("no %s stored", q.what)
		}
	}
}

const secretValue = "c3VwZXItc2VjcmV0LXZhbHVl-e2e"

// workload drives the apiserver with the shapes the analytics need.
type workload struct {
	t     *testing.T
	c     client.Client
	ns    string
	round int
}

func (w *workload) setup() {
	ctx := w.t.Context()
	if err := w.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}); err != nil {
		w.t.Fatal(err)
	}
}

// run performs n rounds; each round writes about a dozen requests.
func (w *workload) run(phase string, n int) {
	ctx := w.t.Context()
	pad := strings.Repeat("x", 900) // make events big enough to rotate the log
	for range n {
		w.round++
		name := fmt.Sprintf("cm-%d", w.round)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}, Data: map[string]string{"v": "0", "pad": pad}}
		must(w.t, phase, w.c.Create(ctx, cm))
		stale := cm.DeepCopy()
		cm.Data["v"] = "1"
		must(w.t, phase, w.c.Update(ctx, cm))
		stale.Data["v"] = "stale"
		if err := w.c.Update(ctx, stale); !apierrors.IsConflict(err) {
			w.t.Fatalf("%s: a stale update answered %v, want a conflict", phase, err)
		}
		if err := w.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}); !apierrors.IsAlreadyExists(err) {
			w.t.Fatalf("%s: create of an existing name answered %v", phase, err)
		}
		must(w.t, phase, w.c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(`{"data":{"v":"2"}}`))))
		apply := func(manager, value string, force bool) error {
			obj := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":%q},"data":{"owned":%q}}`, name, w.ns, value)
			opts := []client.PatchOption{client.FieldOwner(manager)}
			if force {
				opts = append(opts, client.ForceOwnership)
			}
			return w.c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}, client.RawPatch(types.ApplyPatchType, []byte(obj)), opts...)
		}
		must(w.t, phase, apply("alice-tool", "a", true))
		if err := apply("bob-tool", "b", false); !apierrors.IsConflict(err) {
			w.t.Fatalf("%s: conflicting apply answered %v", phase, err)
		}
		if err := w.c.Delete(ctx, cm, client.Preconditions{UID: ptr.To(types.UID("00000000-0000-0000-0000-000000000000"))}); !apierrors.IsConflict(err) {
			w.t.Fatalf("%s: delete with a stale uid answered %v", phase, err)
		}
		must(w.t, phase, w.c.Delete(ctx, cm))
		if w.round%5 == 0 {
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: fmt.Sprintf("s-%d", w.round)}, Data: map[string][]byte{"k": []byte(secretValue)}}
			must(w.t, phase, w.c.Create(ctx, sec))
			w.lease()
		}
	}
}

func (w *workload) lease() {
	ctx := w.t.Context()
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: w.ns, Name: "leader"}
	holder := fmt.Sprintf("e2e-holder-%d", w.round%3)
	if err := w.c.Get(ctx, key, &l); apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "leader"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptr.To[int32](15)}}
		must(w.t, "lease", w.c.Create(ctx, &l))
		return
	} else if err != nil {
		w.t.Fatal(err)
	}
	l.Spec.HolderIdentity = &holder
	must(w.t, "lease", w.c.Update(ctx, &l))
}

func must(t *testing.T, phase string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", phase, err)
	}
}

// logFiles are the audit log and its rotated backups.
func logFiles(t *testing.T, path string) []string {
	t.Helper()
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(filepath.Base(path), ext)
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(path), base+"-*"+ext))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(matches)
	return append(matches, path)
}

// snapshot copies files into a temporary directory, names kept, in order.
func snapshot(t *testing.T, files []string) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, dst)
	}
	return out
}

// responseCompleteIDs reads the log files as ground truth: the audit IDs
// of ResponseComplete events (with how often each occurs).
func responseCompleteIDs(t *testing.T, path string) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, f := range logFiles(t, path) {
		r, err := logfile.Open(f, logfile.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for {
			line, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if line.NoNewline {
				continue // still being written
			}
			var ev struct {
				AuditID string `json:"auditID"`
				Stage   string `json:"stage"`
			}
			if err := json.Unmarshal(line.Data, &ev); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if ev.Stage == audit.StageResponseComplete {
				ids[ev.AuditID]++
			}
		}
		r.Close()
	}
	return ids
}

// storedCounts returns, for cluster, how often each ResponseComplete audit
// ID was inserted, as seen by the probe materialized view (which sees every
// inserted block, before any ReplacingMergeTree merge).
func storedCounts(t *testing.T, conn driver.Conn, cluster string) map[string]int {
	t.Helper()
	rows, err := conn.Query(t.Context(), "SELECT audit_id, count() FROM (SELECT audit_id FROM events_by_hour WHERE toString(cluster) = ? AND stage = 'ResponseComplete' LIMIT 1 BY "+asql.Identity+") GROUP BY audit_id", cluster)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n uint64
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = int(n)
	}
	return out
}

func waitStored(t *testing.T, conn driver.Conn, cluster string, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := storedCounts(t, conn, cluster)
		missing := 0
		for id := range want {
			if got[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster %s: %d of %d ResponseComplete events never arrived", cluster, missing, len(want))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// assertExactlyOnce: every ID of the first snapshot is stored, no event is
// taken twice by a read (copies of one event are one), and nothing is
// stored that the log (read again after the query) does not have.
func assertExactlyOnce(t *testing.T, conn driver.Conn, cluster, logPath string, first map[string]int) {
	got := storedCounts(t, conn, cluster)
	later := responseCompleteIDs(t, logPath)
	for id, n := range first {
		if n != 1 {
			t.Errorf("the log itself has audit ID %s %d times", id, n)
		}
		if got[id] != 1 {
			t.Errorf("audit ID %s stored %d times", id, got[id])
		}
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("audit ID %s stored %d times", id, n)
		}
		if later[id] == 0 {
			t.Errorf("audit ID %s stored but not in the log", id)
		}
	}
}

type rollup map[string]uint64

// rollupCounts counts events per cluster, stage, verb and code, each
// event once by its identity, as every figure does.
func rollupCounts(t *testing.T, conn driver.Conn, cutoff time.Time) rollup {
	t.Helper()
	rows, err := conn.Query(t.Context(), "SELECT concat(toString(cluster), '/', toString(stage), '/', toString(verb), '/', toString(code)) AS k, count() FROM (SELECT cluster, stage, verb, code FROM events_by_hour WHERE event_time < ? LIMIT 1 BY "+asql.Identity+") GROUP BY k", cutoff)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := rollup{}
	for rows.Next() {
		var k string
		var n uint64
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	return out
}

// migrate creates the schema in db.
func migrate(t *testing.T, ch *chtest.Server, db string) {
	t.Helper()
	st, err := store.Open(t.Context(), store.Options{DSN: ch.DSN(), Database: db})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// buildAuditsink returns cmd/auditsink built once for the whole run
// (bintest.Build), to run it as its own process. root and dir are unused;
// they stay for the callers.
func buildAuditsink(t *testing.T, _, _ string) string {
	t.Helper()
	return bintest.Build(t, "./cmd/auditsink")
}

// auditsinkRunner runs the built auditsink as a user types it, with env
// added to the test's environment, and returns its standard output; a
// failure fails the test with its standard error.
func auditsinkRunner(t *testing.T, bin string, env ...string) func(args ...string) []byte {
	return func(args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("auditsink %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out
	}
}
