package suggest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

const (
	hpa    = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
	gitops = "system:serviceaccount:argocd:argocd-application-controller"
)

func writer(ns, field, who string, changes uint64) report.FieldWriter {
	return report.FieldWriter{APIGroup: "apps", Resource: "deployments", Namespace: ns, Field: field, Writer: who, Changes: changes, Objects: 1,
		First: "2026-12-01T00:00:00.000000Z", Last: "2026-12-01T01:00:00.000000Z"}
}

func seen(ns, field string, objects, versions, kindObjects uint64) report.FieldSeen {
	return report.FieldSeen{APIGroup: "apps", Resource: "deployments", Namespace: ns, Field: field, Objects: objects, Versions: versions, KindObjects: kindObjects,
		First: "2026-12-01T00:00:00.000000Z", Last: "2026-12-01T01:00:00.000000Z"}
}

// observations are a shop where the autoscaler owns replicas (one
// intruding change), a legacy namespace where it fights GitOps, labels
// that never change, stampless lost updates of configmaps, and a reused
// name.
func observations() *report.Observations {
	return &report.Observations{
		Writers: []report.FieldWriter{
			writer("shop", "spec.replicas", hpa, 19), writer("shop", "spec.replicas", "deploy-tool", 1),
			writer("legacy", "spec.replicas", hpa, 10), writer("legacy", "spec.replicas", gitops, 9),
			writer("shop", "spec.template.spec.containers[name=web].image", "deploy-tool", 2), // too few
			writer("kube-system", "spec.replicas", hpa, 50),                                   // a system namespace
			writer("shop", "metadata.labels.tier", "alice", 1),                                // changed: never immutable
		},
		Fields: []report.FieldSeen{
			seen("shop", `metadata.labels.team`, 1, 20, 1),
			seen("shop", `metadata.labels["app.kubernetes.io/name"]`, 1, 20, 2), // some objects lack it
			seen("shop", `metadata.labels.tier`, 1, 20, 1),                      // changed
			seen("shop", `metadata.labels.new`, 1, 3, 1),                        // too few writes
			seen("shop", `spec.template.spec.containers[name=web].name`, 1, 20, 1),
		},
		LostUpdates: []report.LostUpdate{
			{Resource: "configmaps", Namespace: "legacy", Name: "flags", Field: "data.search", Writer: "alice", OverwrittenWriter: "oncall", Cause: "stampless", AuditID: "b", Time: "2026-12-01T00:00:02.000000Z"},
			{Resource: "configmaps", Namespace: "legacy", Name: "flags", Field: "data.search", Writer: "alice", OverwrittenWriter: "oncall", Cause: "stampless", AuditID: "a", Time: "2026-12-01T00:00:01.000000Z"},
			{Resource: "configmaps", Namespace: "legacy", Name: "checkout", Field: "data.timeout", Writer: "release-bot", OverwrittenWriter: "oncall", Cause: "laundered_stamp", AuditID: "c", Time: "2026-12-01T00:00:03.000000Z"},
		},
		NameReuses: []report.NameReuse{
			{Resource: "configmaps", Namespace: "jobs", Reuses: 2, Names: 1, Deleters: []string{"cleaner"}, Creators: []string{"runner"}},
			{APIGroup: "coordination.k8s.io", Resource: "leases", Namespace: "jobs", Reuses: 5, Names: 1, Deleters: []string{"a"}, Creators: []string{"b"}},
		},
	}
}

func TestBuildDraftsWhatTheHistorySupports(t *testing.T) {
	drafts, err := Build(observations(), DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range drafts {
		p := d.Policy()
		line := p.Name + ":"
		if p.Spec.RequireResourceVersion {
			line += " stamp"
		}
		if p.Spec.RequireDeletePreconditions != "" {
			line += " delete=" + string(p.Spec.RequireDeletePreconditions)
		}
		for _, o := range p.Spec.FieldOwners {
			line += " owner(" + o.Path + "=" + strings.Join(append(o.Writers.ServiceAccounts, o.Writers.Users...), ",") + ")"
		}
		for _, i := range p.Spec.ImmutableFields {
			line += " immutable(" + i.Path + "=" + string(i.Mode) + ")"
		}
		if p.Spec.Action != v1alpha1.ActionAudit {
			t.Errorf("%s: action %s, want Audit", p.Name, p.Spec.Action)
		}
		got = append(got, line)
	}
	want := []string{
		"suggested-jobs-configmaps: delete=uid",
		"suggested-legacy-configmaps: stamp",
		`suggested-shop-deployments.apps: owner(spec.replicas=kube-system/horizontal-pod-autoscaler) immutable(metadata.labels.team=Always) immutable(metadata.labels["app.kubernetes.io/name"]=OnceSet)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("drafts\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
	shop := drafts[2]
	if o := shop.Owners[0]; o.Changes != 19 || o.Total != 20 || len(o.Others) != 1 || o.Others[0] != (WriterCount{"deploy-tool", 1}) {
		t.Errorf("the owner's evidence: %+v", o)
	}
	if s := drafts[1].Stamp; s.Lost != 2 || s.Example.AuditID != "a" || s.Writers[0] != (WriterCount{"alice", 2}) {
		t.Errorf("the stamp's evidence: %+v", s)
	}
}

func TestThresholdsMove(t *testing.T) {
	o := DefaultOptions()
	o.OwnerShare, o.MinChanges, o.MinWrites = 0.51, 2, 100
	o.ExcludeNamespaces = []string{"jobs"}
	drafts, err := Build(observations(), o)
	if err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, d := range drafts {
		if d.Kind.Namespace == "jobs" {
			t.Errorf("an excluded namespace drafted: %s", d.Name)
		}
		if len(d.Immutable) > 0 {
			t.Errorf("%s: immutable fields with 20 versions under --min-writes 100", d.Name)
		}
		for _, r := range d.Owners {
			owners = append(owners, d.Kind.Namespace+" "+r.Path+" "+r.Owner)
		}
	}
	want := "legacy spec.replicas " + hpa + "|shop spec.replicas " + hpa + "|shop spec.template.spec.containers[name=web].image deploy-tool"
	if strings.Join(owners, "|") != want {
		t.Errorf("owners at share 0.51 and 2 changes:\n got %s\nwant %s", strings.Join(owners, "|"), want)
	}
	for _, bad := range []Options{{OwnerShare: 0.5, MinChanges: 1, MinLostUpdates: 1, MinReuses: 1}, {OwnerShare: 0.9, MinLostUpdates: 1, MinReuses: 1},
		{OwnerShare: 0.9, MinChanges: 1, MinLostUpdates: 1, MinReuses: 1, ImmutablePaths: []string{"metadata..labels"}}} {
		if _, err := Build(observations(), bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// TestWriteLoadsAsTheWebhookLoadsPolicies: the YAML written is what
// policy.Load takes (the webhook's and replay's loader), equal to the
// drafts' own policies, and the same drafts write the same bytes.
func TestWriteLoadsAsTheWebhookLoadsPolicies(t *testing.T) {
	drafts, err := Build(observations(), DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	drafts[0].Delete.Replay = Replayed{Done: true, Refused: 2, Writers: []WriterCount{{"cleaner", 2}}, Undecidable: 1, Reasons: []WriterCount{{"the log lacks the object\nnext line", 1}}}
	drafts[0].Delete.Deleters = []string{"evil\n  requireResourceVersion: false"}
	var a, b bytes.Buffer
	h := Header{Since: "s", Until: "u", Source: "audit.log", Options: DefaultOptions()}
	if err := Write(&a, h, drafts); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, h, drafts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same drafts wrote different bytes")
	}
	ps, err := policy.Load(bytes.NewReader(a.Bytes()))
	if err != nil {
		t.Fatalf("%v\n%s", err, a.String())
	}
	if len(ps) != len(drafts) {
		t.Fatalf("loaded %d policies of %d drafts", len(ps), len(drafts))
	}
	set, err := Policies(drafts)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(set.Names(), ","), "suggested-jobs-configmaps,suggested-legacy-configmaps,suggested-shop-deployments.apps"; got != want {
		t.Errorf("names %s, want %s", got, want)
	}
	for _, line := range strings.Split(a.String(), "\n") {
		if strings.Contains(line, "evil") && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			t.Errorf("a writer's name broke out of its comment: %q", line)
		}
	}
	if !strings.Contains(strings.ReplaceAll(a.String(), "\n  # ", " "), "would refuse 2 writes (cleaner 2); 1 undecidable: 1 as the log lacks the object next line.") {
		t.Errorf("the replay is not told:\n%s", a.String())
	}
	t.Logf("\n%s", a.String())
}
