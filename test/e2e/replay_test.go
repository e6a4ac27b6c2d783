package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/replay"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/replaytest"
)

// recommendedAuditPolicy is docs/audit-policy.yaml, the audit levels the
// README asks users to run the apiserver with.
func recommendedAuditPolicy(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kubetest.RepoRoot(t), "docs", "audit-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// replayEqualsEnforcement replays env's audit log, written while the
// webhook decided, over the writes of [since, until) at the cluster's
// policies, none of which may have changed since they were created, and
// requires for every write the webhook's own decisions (replaytest). Every
// rule kind and action must be among the decisions compared. Then the
// built `webhook replay --policies-from-cluster` must print the report
// the library computed.
func replayEqualsEnforcement(t *testing.T, env *webhookEnv, since, until time.Time) {
	t.Helper()
	ctx := t.Context()
	// The log holds a write made after until: the writes before it are in.
	create(t, env.Client, configMap("default", "replay-sentinel", nil))
	eventually(t, 15*time.Second, func() error {
		return auditLogHas(env.AuditLogPath, `"name":"replay-sentinel"`, `"stage":"ResponseComplete"`)
	})

	// A copy, to its last whole line: both replays below read the same
	// events, while the apiserver goes on appending to its log (the
	// command's own requests among them).
	logBytes, err := os.ReadFile(env.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	auditLog := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(auditLog, logBytes[:bytes.LastIndexByte(logBytes, '\n')+1], 0o600); err != nil {
		t.Fatal(err)
	}

	var list v1alpha1.ConcurrencyPolicyList
	if err := env.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	var ps []*policy.Policy
	for i := range list.Items {
		item := &list.Items[i]
		if item.Generation != 1 {
			t.Fatalf("policy %s changed (generation %d) during the writes replayed: no fixed set to replay", item.Name, item.Generation)
		}
		p, err := policy.Compile(item)
		if err != nil {
			t.Fatalf("policy %s: %v", item.Name, err)
		}
		ps = append(ps, p)
	}
	var nsList corev1.NamespaceList
	if err := env.Client.List(ctx, &nsList); err != nil {
		t.Fatal(err)
	}
	namespaces := map[string]labels.Set{}
	for _, n := range nsList.Items {
		namespaces[n.Name] = labels.Set(n.Labels)
	}
	// The bounds as the command line carries them.
	sinceArg, untilArg := since.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano)
	since, _ = time.Parse(time.RFC3339Nano, sinceArg)
	until, _ = time.Parse(time.RFC3339Nano, untilArg)

	r, res := replaytest.EqualsEnforcement(t, replay.Options{
		Policies: policy.NewSet(ps...), ProtectedNamespaces: []string{"stampguard-system"},
		Since: since, Until: until, Namespaces: namespaces,
	}, workloadAfterScale, auditLog)
	for _, want := range []struct {
		rule   policy.RuleKind
		action v1alpha1.Action
	}{
		{policy.RuleStampMissing, v1alpha1.ActionDeny},
		{policy.RuleFieldOwner, v1alpha1.ActionDeny},
		{policy.RuleImmutableField, v1alpha1.ActionDeny},
		{policy.RuleDeletePrecondition, v1alpha1.ActionDeny},
		{policy.RuleImmutableField, v1alpha1.ActionWarn},
		{policy.RuleImmutableField, v1alpha1.ActionAudit},
	} {
		if key := string(want.rule) + " " + string(want.action); res.Compared[key] == 0 {
			t.Errorf("no %s decision of the webhook was compared (compared: %v)", key, res.Compared)
		}
	}
	if res.Excused > 1 {
		t.Errorf("%d writes the webhook decided were undecidable: the test writes one deployment update after a /scale write", res.Excused)
	}
	want := r.Report()
	want.Trim(replay.DefaultTop)

	webhook := bintest.Build(t, "./cmd/webhook")
	kubeconfig := writeKubeconfig(t, env.Config, filepath.Join(t.TempDir(), "kubeconfig"))
	replaytest.CommandPrintsReport(t, want, webhook, "replay", "--policies-from-cluster", "--kubeconfig", kubeconfig,
		"--namespace", "stampguard-system", "--since", sinceArg, "--until", untilArg, "--format", "json", auditLog)
}

// workloadAfterScale excuses the write to a workload that follows a write
// to its /scale: the log holds that write's Scale, not the workload it
// left, so the replay cannot know the object the next update replaced.
// TestWebhook's field owners subtest makes one such update.
func workloadAfterScale(w *replay.Write) bool {
	return w.Resource == "deployments.apps" && strings.Contains(w.Reason, "the log does not hold the object at resourceVersion")
}
