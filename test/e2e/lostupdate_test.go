package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
)

// lostRow is what a lost update says, without its audit IDs and times.
type lostRow struct{ name, field, writer, overwritten, cause string }

// TestLostUpdatesEqualWhatTheClientsDid drives each road to a lost update
// with the real kubectl and client-go against a real apiserver: kubectl
// replace of a stale manifest (a laundered stamp), a forced server-side
// apply, a merge patch of a list, a stampless PUT; an HPA-style writer on
// /scale against a GitOps-style writer on the Deployment (a fight); and
// the controls that lose nothing: read-modify-write with retry on
// conflict, an honest revert, server-side apply of disjoint fields by two
// managers, a stale stamp refused with 409, stampless PUTs on an object no
// one else writes, and repeated applies of one manifest (no-op writes).
// The audit log goes through `auditsink ingest` into ClickHouse, and
// `auditsink report --format json` must name exactly what the clients did:
// no finding missed, none invented.
func TestLostUpdatesEqualWhatTheClientsDid(t *testing.T) {
	kubectlBin, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("this test drives the real kubectl, which is not on PATH: %v", err)
	}
	// The audit policy the README recommends: writes of configmaps and
	// deployments (and their scale) with their responses.
	policy, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(t), "docs", "audit-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(t, kubetest.Options{AuditPolicy: string(policy), AuditLog: true})
	ctx := t.Context()
	dir := t.TempDir()
	kubeconfig := writeKubeconfig(t, env.Config, filepath.Join(dir, "kubeconfig"))
	as := func(user string) *kubernetes.Clientset { return kubernetes.NewForConfigOrDie(env.As(user)) }
	kubectl := func(user, manifest string, args ...string) {
		t.Helper()
		path := filepath.Join(dir, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
		if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--kubeconfig", kubeconfig, "--as", user, "--as-group", "system:masters"}, append(args, "-f", path)...)
		if out, err := exec.CommandContext(ctx, kubectlBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	const ns = "default"
	cm := func(name string, data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
	}
	create := func(user string, o *corev1.ConfigMap) {
		t.Helper()
		if _, err := as(user).CoreV1().ConfigMaps(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// rmw reads the object and writes it back changed, with its stamp.
	rmw := func(user, name string, change func(*corev1.ConfigMap)) {
		t.Helper()
		c := as(user).CoreV1().ConfigMaps(ns)
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o, err := c.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(o)
			_, err = c.Update(ctx, o, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now().Add(-time.Second)
	var wantLost []lostRow

	// 1. kubectl replace of a manifest without a stamp: kubectl copies the
	// live stamp in, and the team's change is gone.
	create("gitops", cm("replaced", map[string]string{"mode": "a"}))
	rmw("alice", "replaced", func(o *corev1.ConfigMap) { o.Data["mode"] = "b" })
	kubectl("deploy-tool", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: replaced\n  namespace: default\ndata:\n  mode: a\n", "replace")
	wantLost = append(wantLost, lostRow{"replaced", "data.mode", "deploy-tool", "alice", "laundered_stamp"})

	// 2. A forced server-side apply takes alice's field.
	kubectl("alice", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: default\ndata:\n  x: \"1\"\n",
		"apply", "--server-side", "--field-manager", "alice")
	kubectl("bob", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: default\ndata:\n  x: \"2\"\n",
		"apply", "--server-side", "--force-conflicts", "--field-manager", "bob")
	wantLost = append(wantLost, lostRow{"applied", "data.x", "bob", "alice", "forced_apply"})

	// 3. A merge patch of the finalizers drops the one a controller added.
	fin := cm("finalized", nil)
	fin.Finalizers = []string{"example.com/a"}
	create("gitops", fin)
	rmw("ctrl", "finalized", func(o *corev1.ConfigMap) { o.Finalizers = append(o.Finalizers, "example.com/b") })
	if _, err := as("script").CoreV1().ConfigMaps(ns).Patch(ctx, "finalized", types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["example.com/a","example.com/c"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	wantLost = append(wantLost, lostRow{"finalized", "metadata.finalizers[*]", "script", "ctrl", "list_replaced"})

	// 4. A stampless PUT over alice's change.
	create("alice", cm("blind", map[string]string{"k": "v1"}))
	rmw("alice", "blind", func(o *corev1.ConfigMap) { o.Data["k"] = "v2" })
	if _, err := as("bot").CoreV1().ConfigMaps(ns).Update(ctx, cm("blind", map[string]string{"k": "v1"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantLost = append(wantLost, lostRow{"blind", "data.k", "bot", "alice", "stampless"})

	// 5. The HPA on /scale against GitOps on the Deployment: a fight, and
	// no lost update (every write is a patch of a value or a stamped
	// update).
	labels := map[string]string{"app": "web"}
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}}}
	if _, err := as("gitops").AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{4, 5} {
		if _, err := as("hpa").AppsV1().Deployments(ns).Patch(ctx, "web", types.MergePatchType,
			fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n), metav1.PatchOptions{}, "scale"); err != nil {
			t.Fatal(err)
		}
		d := as("gitops").AppsV1().Deployments(ns)
		cur, err := d.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.Replicas = ptr.To[int32](2)
		if _, err := d.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wantFights := []report.FieldFight{{APIGroup: "apps", Resource: "deployments", Namespace: ns, Name: "web", Field: "spec.replicas",
		Writers: []string{"gitops", "hpa"}, Changes: 4, Handoffs: 4}}

	// Controls. 6: two read-modify-write writers of one object, one 409
	// and its retry; who blocked whom.
	create("gitops", cm("shared", map[string]string{"a": "0", "b": "0"}))
	ca, cb := as("writer-a").CoreV1().ConfigMaps(ns), as("writer-b").CoreV1().ConfigMaps(ns)
	readA, err := ca.Get(ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	readB, err := cb.Get(ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	readA.Data["a"] = "1"
	if _, err := ca.Update(ctx, readA, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	readB.Data["b"] = "1"
	if _, err := cb.Update(ctx, readB, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("writer-b's stale update: %v, want a 409", err)
	}
	rmw("writer-b", "shared", func(o *corev1.ConfigMap) { o.Data["b"] = "1" })
	wantCauses := []report.ConflictCause{{Writer: "writer-b", BlockedBy: "writer-a", Conflicts: 1}}

	// 7: an honest revert: gitops read alice's change and set its value back.
	create("gitops", cm("reverted", map[string]string{"v": "1"}))
	rmw("alice", "reverted", func(o *corev1.ConfigMap) { o.Data["v"] = "2" })
	rmw("gitops", "reverted", func(o *corev1.ConfigMap) { o.Data["v"] = "1" })

	// 8: server-side apply of disjoint fields by two managers.
	kubectl("m1", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: disjoint\n  namespace: default\ndata:\n  p: \"1\"\n",
		"apply", "--server-side", "--field-manager", "m1")
	kubectl("m2", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: disjoint\n  namespace: default\ndata:\n  q: \"1\"\n",
		"apply", "--server-side", "--field-manager", "m2")

	// 9: a stale stamp refused with 409.
	create("gitops", cm("stale", map[string]string{"s": "1"}))
	late := as("late").CoreV1().ConfigMaps(ns)
	old, err := late.Get(ctx, "stale", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rmw("alice", "stale", func(o *corev1.ConfigMap) { o.Data["s"] = "2" })
	old.Data["s"] = "3"
	if _, err := late.Update(ctx, old, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("a stale stamp: %v, want a 409", err)
	}
	// The report orders by conflicts, then writer.
	wantCauses = append([]report.ConflictCause{{Writer: "late", BlockedBy: "alice", Conflicts: 1}}, wantCauses...)

	// 10: stampless PUTs on an object no one else writes.
	create("solo-bot", cm("solo", map[string]string{"n": "1"}))
	for _, n := range []string{"2", "3"} {
		if _, err := as("solo-bot").CoreV1().ConfigMaps(ns).Update(ctx, cm("solo", map[string]string{"n": n}), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// 11: one manifest applied three times: two writes store nothing.
	for range 3 {
		kubectl("applier", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: same\n  namespace: default\ndata:\n  z: \"1\"\n",
			"apply", "--server-side", "--field-manager", "applier")
	}
	wantNoops := []report.NoopWrites{{User: "applier", Count: 2}}
	// What each writer changed, field by field (creations set fields but
	// change none): the observed owners the report must list.
	cms := func(field, writer string, changes uint64) report.FieldWriter {
		return report.FieldWriter{Resource: "configmaps", Namespace: ns, Field: field, Writer: writer, Changes: changes, Objects: 1}
	}
	wantWriters := []report.FieldWriter{
		cms("data.mode", "alice", 1), cms("data.mode", "deploy-tool", 1), cms("data.x", "bob", 1),
		cms("metadata.finalizers[*]", "ctrl", 1), cms("metadata.finalizers[*]", "script", 1),
		cms("data.k", "alice", 1), cms("data.k", "bot", 1),
		{APIGroup: "apps", Resource: "deployments", Namespace: ns, Field: "spec.replicas", Writer: "gitops", Changes: 2, Objects: 1},
		{APIGroup: "apps", Resource: "deployments", Namespace: ns, Field: "spec.replicas", Writer: "hpa", Changes: 2, Objects: 1},
		cms("data.a", "writer-a", 1), cms("data.b", "writer-b", 1), cms("data.v", "alice", 1), cms("data.v", "gitops", 1),
		cms("data.q", "m2", 1), cms("data.s", "alice", 1), cms("data.n", "solo-bot", 2),
	}
	until := time.Now().Add(time.Second)

	// The log, as the apiserver wrote it, through the binaries.
	ch := chtest.Start(t)
	db := ch.NewDatabase(t)
	bin := buildAuditsink(t, "", "")
	sink := auditsinkRunner(t, bin, "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
	waitLogged(t, env.AuditLogPath, "same", "patch", 3)
	// One snapshot of the log, past the window's end, for the server and
	// the file report alike: the apiserver keeps appending its own
	// requests, and one logged between the two reads would fall in the
	// window of the second only.
	time.Sleep(time.Until(until))
	logCopy := snapshot(t, []string{env.AuditLogPath})[0]
	sink("ingest", "--database", db, "--cluster", "e2e", logCopy)
	out := sink("report", "--history", "--database", db, "--cluster", "e2e", "--format", "json", "--top", "1000",
		"--since", since.UTC().Format(time.RFC3339Nano), "--until", until.UTC().Format(time.RFC3339Nano))
	var got report.Report
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}

	var gotLost []lostRow
	for _, l := range got.LostUpdates {
		gotLost = append(gotLost, lostRow{l.Name, l.Field, l.Writer, l.OverwrittenWriter, l.Cause})
		if l.AuditID == "" || l.OverwrittenAuditID == "" || l.Time <= l.OverwrittenTime || l.Namespace != ns {
			t.Errorf("lost update %+v: audit IDs, times or namespace wrong", l)
		}
	}
	sortLost := func(ls []lostRow) {
		slices.SortFunc(ls, func(a, b lostRow) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	}
	sortLost(gotLost)
	sortLost(wantLost)
	if !slices.Equal(gotLost, wantLost) {
		t.Errorf("lost updates\n got %+v\nwant %+v", gotLost, wantLost)
	}
	for i := range got.FieldFights {
		got.FieldFights[i].First, got.FieldFights[i].Last = "", ""
	}
	if fmt.Sprint(got.FieldFights) != fmt.Sprint(wantFights) {
		t.Errorf("field fights\n got %+v\nwant %+v", got.FieldFights, wantFights)
	}
	if fmt.Sprint(got.ConflictCauses) != fmt.Sprint(wantCauses) {
		t.Errorf("conflict causes\n got %+v\nwant %+v", got.ConflictCauses, wantCauses)
	}
	if fmt.Sprint(got.NoopWrites) != fmt.Sprint(wantNoops) {
		t.Errorf("no-op writes\n got %+v\nwant %+v", got.NoopWrites, wantNoops)
	}
	gotWriters := got.FieldWriters
	for i := range gotWriters {
		if gotWriters[i].First == "" || gotWriters[i].First > gotWriters[i].Last {
			t.Errorf("field writer %+v: first and last wrong", gotWriters[i])
		}
		gotWriters[i].First, gotWriters[i].Last = "", ""
	}
	sortWriters := func(ws []report.FieldWriter) {
		slices.SortFunc(ws, func(a, b report.FieldWriter) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	}
	sortWriters(gotWriters)
	sortWriters(wantWriters)
	if !slices.Equal(gotWriters, wantWriters) {
		t.Errorf("field writers\n got %+v\nwant %+v", gotWriters, wantWriters)
	}

	t.Run("the report from the log file names the same", func(t *testing.T) {
		file := auditsinkRunner(t, bin, chdbtest.LibEnv+"="+chdbtest.LibPath())("report", "--history", "--cluster", "e2e", "--format", "json", "--top", "1000",
			"--since", since.UTC().Format(time.RFC3339Nano), "--until", until.UTC().Format(time.RFC3339Nano), logCopy)
		if !bytes.Equal(file, out) {
			t.Errorf("the report from the file differs from the server's\n%s", lineDiff(string(out), string(file)))
		}
	})
	t.Run("the table names them", func(t *testing.T) {
		table := string(sink("report", "--history", "--database", db, "--cluster", "e2e", "--top", "1000",
			"--since", since.UTC().Format(time.RFC3339Nano), "--until", until.UTC().Format(time.RFC3339Nano)))
		for _, want := range []string{"LOST UPDATES", "alice -> deploy-tool", "laundered_stamp", "FIELD FIGHTS", "spec.replicas",
			"WHO CAUSED THE VERSION CONFLICTS", "WRITES THAT STORED NOTHING", "FIELD WRITERS", "solo-bot"} {
			if !strings.Contains(table, want) {
				t.Errorf("the table lacks %q\n%s", want, table)
			}
		}
	})
}

// waitLogged waits until the audit log holds n ResponseComplete events of
// verb on objects named name: the log backend writes asynchronously.
func waitLogged(t *testing.T, path, name, verb string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"stage":"ResponseComplete"`) && strings.Contains(l, `"name":"`+name+`"`) && strings.Contains(l, `"verb":"`+verb+`"`) {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log holds %d of %d %s events of %s", got, n, verb, name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
