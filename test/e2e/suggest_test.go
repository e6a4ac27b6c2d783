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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/replay"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/replaytest"
)

// TestSuggestInfersTheKnownOwners drives client-go writers on a real
// apiserver, each owning its fields (two ConfigMap keys, a Deployment's
// replicas through /scale by a service account, its image), through a
// quiet first half and a second half with an intruder on two owned
// fields, and a name deleted and created again by another writer. The
// built `auditsink suggest` on the audit log must infer exactly the
// owners and the labels that never change, in drafts the apiserver's CRD
// takes as they are; the built `webhook replay` of the whole log's drafts
// must refuse exactly the intruder's writes, and of the quiet half's
// drafts nothing. The same drafts come from the history stored on
// ClickHouse 18.16, and the same files give the same bytes.
func TestSuggestInfersTheKnownOwners(t *testing.T) {
	policyText, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(t), "docs", "audit-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(t, kubetest.Options{AuditPolicy: string(policyText), AuditLog: true})
	ctx := t.Context()
	as := func(user string) *kubernetes.Clientset { return kubernetes.NewForConfigOrDie(env.As(user)) }
	admin := kubernetes.NewForConfigOrDie(env.Config)
	const ns, jobs = "owners", "jobs"
	const scaler = "system:serviceaccount:kube-system:scaler"
	for _, n := range []string{ns, jobs} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now().Add(-time.Second)
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: ns, Labels: map[string]string{"tier": "gold"}},
		Data: map[string]string{"a": "0", "b": "0"}}
	if _, err := as("platform").CoreV1().ConfigMaps(ns).Create(ctx, settings, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "api"}
	api := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns, Labels: map[string]string{"team": "payments"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "api", Image: "registry.example/api:0"}}}}}}
	if _, err := as("platform").AppsV1().Deployments(ns).Create(ctx, api, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Each write is a stamped read-modify-write with retry: honest
	// writers, no lost update.
	setKey := func(user, key, value string) {
		t.Helper()
		c := as(user).CoreV1().ConfigMaps(ns)
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o, err := c.Get(ctx, "settings", metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.Data[key] = value
			_, err = c.Update(ctx, o, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	deployment := func(user string, change func(*appsv1.Deployment)) {
		t.Helper()
		d := as(user).AppsV1().Deployments(ns)
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o, err := d.Get(ctx, "api", metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(o)
			_, err = d.Update(ctx, o, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	scale := func(n int32) {
		t.Helper()
		d := as(scaler).AppsV1().Deployments(ns)
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s, err := d.GetScale(ctx, "api", metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Spec.Replicas = n
			_, err = d.UpdateScale(ctx, "api", s, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	owners := func(round int) {
		for i := range 5 {
			v := round*5 + i + 1
			setKey("writer-a", "a", fmt.Sprint(v))
			setKey("writer-b", "b", fmt.Sprint(v))
			scale(int32(2 + v%4))
			deployment("deployer", func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[0].Image = fmt.Sprintf("registry.example/api:%d", v)
			})
		}
	}
	owners(0)
	time.Sleep(1100 * time.Millisecond)
	mid := time.Now()
	time.Sleep(1100 * time.Millisecond)
	owners(1)
	// The intruder: one change of writer-a's key, one of the scaler's
	// replicas, each an honest stamped write.
	setKey("intruder", "a", "intruded")
	deployment("intruder", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](9) })
	// A name deleted by a cleaner and created again by a runner.
	run := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "run", Namespace: jobs}, Data: map[string]string{"n": "1"}}
	if _, err := as("runner").CoreV1().ConfigMaps(jobs).Create(ctx, run, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := as("cleaner").CoreV1().ConfigMaps(jobs).Delete(ctx, "run", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := as("runner").CoreV1().ConfigMaps(jobs).Create(ctx, run, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, env.AuditLogPath, "run", "create", 2)
	until := time.Now().Add(time.Second)

	// The truth: who the clients made own what.
	wantOwners := []string{
		"configmaps owners data.a users=writer-a",
		"configmaps owners data.b users=writer-b",
		"deployments owners spec.replicas serviceAccounts=kube-system/scaler",
		"deployments owners spec.template.spec.containers[name=api].image users=deployer",
	}
	wantImmutable := []string{"configmaps owners metadata.labels.tier Always", "deployments owners metadata.labels.team Always"}

	dir := t.TempDir()
	bin := buildAuditsink(t, "", "")
	sink := auditsinkRunner(t, bin, chdbtest.LibEnv+"="+chdbtest.LibPath(), "AUDITSINK_CLICKHOUSE_DSN=")
	window := func(from, to time.Time) []string {
		return []string{"--since", from.UTC().Format(time.RFC3339Nano), "--until", to.UTC().Format(time.RFC3339Nano)}
	}
	keep := filepath.Join(dir, "keep")
	suggest := func(args ...string) []byte {
		t.Helper()
		return sink(append(append([]string{"suggest", "--keep", keep, "--no-progress"}, args...), env.AuditLogPath)...)
	}
	whole := suggest(append(window(since, until), "--namespace", ns)...)
	if again := suggest(append(window(since, until), "--namespace", ns)...); !bytes.Equal(again, whole) {
		t.Errorf("the same files gave other drafts:\n%s\n---\n%s", whole, again)
	}
	t.Logf("the drafts of the whole log:\n%s", whole)
	gotOwners, gotImmutable, drafts := draftRules(t, whole)
	if !slices.Equal(gotOwners, wantOwners) || !slices.Equal(gotImmutable, wantImmutable) {
		t.Errorf("inferred\n owners %q\n immutable %q\nwant\n owners %q\n immutable %q", gotOwners, gotImmutable, wantOwners, wantImmutable)
	}
	for _, d := range drafts {
		if d.Spec.Action != v1alpha1.ActionAudit || d.Spec.RequireResourceVersion || d.Spec.RequireDeletePreconditions != "" {
			t.Errorf("%s: action %s, stamp %v, delete %q; want Audit and no stamp or delete rule (no lost update, no reused name in %s)",
				d.Name, d.Spec.Action, d.Spec.RequireResourceVersion, d.Spec.RequireDeletePreconditions, ns)
		}
	}
	// The comments tell the replay: the intruder's one write per owned
	// field it changed, and nothing else. (Updates of the Deployment after
	// a /scale write are undecidable: the Scale the log holds is not the
	// Deployment it replaced.)
	if n := strings.Count(replaytest.FlatComments(whole), "would refuse 1 write (intruder 1);"); n != 2 {
		t.Errorf("%d rules say they would refuse the intruder's one write, want 2 (data.a, spec.replicas)", n)
	}
	if n := strings.Count(replaytest.FlatComments(whole), "would refuse 0 writes;"); n != len(wantOwners)+len(wantImmutable)-2 {
		t.Errorf("%d rules say they would refuse nothing, want the %d the intruder did not touch", n, len(wantOwners)+len(wantImmutable)-2)
	}

	// The drafts are what the CRD takes, as they are.
	draftFile := filepath.Join(dir, "drafts.yaml")
	if err := os.WriteFile(draftFile, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	kubectlApply(t, env, dir, draftFile)

	// webhook replay of the drafts switched to Deny (the last step of the
	// workflow) refuses exactly the intruder's writes.
	denyFile := filepath.Join(dir, "deny.yaml")
	if err := os.WriteFile(denyFile, bytes.ReplaceAll(whole, []byte("action: Audit"), []byte("action: Deny")), 0o600); err != nil {
		t.Fatal(err)
	}
	webhook := bintest.Build(t, "./cmd/webhook")
	rep := replayJSON(t, webhook, denyFile, env.AuditLogPath)
	var refusedBy []string
	for _, r := range rep.Refused {
		refusedBy = append(refusedBy, r.User+" "+r.Verb+" "+r.Resource+" "+r.Name)
	}
	if want := []string{"intruder update configmaps settings", "intruder update deployments.apps api"}; !slices.Equal(refusedBy, want) {
		t.Errorf("the drafts' replay refuses %q, want the intruder's writes %q", refusedBy, want)
	}

	// The quiet half: the same owners, and a replay that refuses nothing.
	quiet := suggest(append(window(since, mid), "--namespace", ns)...)
	quietOwners, quietImmutable, _ := draftRules(t, quiet)
	if !slices.Equal(quietOwners, wantOwners) || !slices.Equal(quietImmutable, wantImmutable) {
		t.Errorf("the quiet half inferred owners %q, immutable %q", quietOwners, quietImmutable)
	}
	quietFile := filepath.Join(dir, "quiet.yaml")
	if err := os.WriteFile(quietFile, quiet, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(quietFile, bytes.ReplaceAll(quiet, []byte("action: Audit"), []byte("action: Deny")), 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := replayJSON(t, webhook, quietFile, env.AuditLogPath, window(since, mid)...); len(rep.Refused) != 0 || rep.Writes == 0 {
		t.Errorf("the quiet half's drafts refuse %d of its %d writes, want none: %+v", len(rep.Refused), rep.Writes, rep.Refused)
	}
	if n := strings.Count(replaytest.FlatComments(quiet), "Replay: would refuse 0 writes;"); n != len(wantOwners)+len(wantImmutable) {
		t.Errorf("%d of the quiet half's %d rules say they refuse nothing", n, len(wantOwners)+len(wantImmutable))
	}

	// The reused name drafts delete preconditions, and nothing else.
	_, _, reuse := draftRules(t, suggest(append(window(since, until), "--namespace", jobs)...))
	if len(reuse) != 1 || reuse[0].Spec.RequireDeletePreconditions != v1alpha1.DeletePreconditionUID || len(reuse[0].Spec.FieldOwners) > 0 {
		t.Errorf("the reused name drafted %+v, want one policy with delete preconditions", reuse)
	}

	// The history stored on ClickHouse 18.16 drafts the same policies.
	ch := chtest.Start(t)
	db := ch.NewDatabase(t)
	server := auditsinkRunner(t, bin, "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())
	server("ingest", "--database", db, env.AuditLogPath)
	fromServer := server(append(append([]string{"suggest", "--database", db}, window(since, until)...), "--namespace", ns)...)
	if !strings.Contains(string(fromServer), "Not replayed") {
		t.Errorf("the server's drafts do not say they were not replayed:\n%s", fromServer)
	}
	so, si, _ := draftRules(t, fromServer)
	if !slices.Equal(so, gotOwners) || !slices.Equal(si, gotImmutable) {
		t.Errorf("18.16 drafted owners %q, immutable %q; the files %q, %q", so, si, gotOwners, gotImmutable)
	}
}

// draftRules reads suggest's YAML: its field owners and immutable fields
// as "resource namespace path writers", and the policies.
func draftRules(t *testing.T, out []byte) (owners, immutable []string, policies []v1alpha1.ConcurrencyPolicy) {
	t.Helper()
	policies = replaytest.Drafts(t, out)
	for _, p := range policies {
		where := p.Spec.Match.Resources[0].Resource + " " + strings.Join(p.Spec.Match.Namespaces, ",")
		for _, o := range p.Spec.FieldOwners {
			w := o.Writers
			switch {
			case len(w.ServiceAccounts) > 0:
				owners = append(owners, where+" "+o.Path+" serviceAccounts="+strings.Join(w.ServiceAccounts, ","))
			default:
				owners = append(owners, where+" "+o.Path+" users="+strings.Join(w.Users, ","))
			}
		}
		for _, f := range p.Spec.ImmutableFields {
			immutable = append(immutable, where+" "+f.Path+" "+string(f.Mode))
		}
	}
	slices.Sort(owners)
	slices.Sort(immutable)
	return owners, immutable, policies
}

// replayJSON runs the built `webhook replay --format json` of a policy
// file over a log.
func replayJSON(t *testing.T, webhook, policyFile, log string, args ...string) replay.Report {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), webhook, append(append([]string{"replay", "--policy-file", policyFile, "--format", "json"}, args...), log)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("webhook replay: %v\n%s", err, stderr.String())
	}
	var r replay.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("webhook replay: %v\n%s", err, out)
	}
	return r
}

// kubectlApply applies a file with the real kubectl, as a user would.
func kubectlApply(t *testing.T, env *kubetest.Env, dir, file string) {
	t.Helper()
	kubectlBin, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is not on PATH: %v", err)
	}
	kubeconfig := writeKubeconfig(t, env.Config, filepath.Join(dir, "kubeconfig"))
	if out, err := exec.CommandContext(t.Context(), kubectlBin, "--kubeconfig", kubeconfig, "apply", "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -f %s: %v\n%s", file, err, out)
	}
}
