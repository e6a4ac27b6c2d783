package main

import (
	"bytes"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/replay"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/replaytest"
	"github.com/stampguard/stampguard/test/workload/contention"
)

// suggestMatchesTheDemo runs the built `auditsink suggest` on the demo's
// own audit log and requires the drafts the issue names: the autoscaler
// owns spec.replicas of the shop's Deployments, the team label is
// immutable, and the legacy ConfigMaps, where alice's stampless PUTs
// erased the on-call SRE's flag, need a stamp. Then it replays the drafts
// with the webhook's engine: each of those three rules must decide
// exactly the writes the live webhook decided by the demo policy's rule
// of the same meaning (examples/demo-policies.yaml), except where the
// live webhook never reached the rule's phase (a write it had refused in
// the stamp phase already).
func suggestMatchesTheDemo(t *testing.T, auditsink, state string) {
	t.Helper()
	auditLog := filepath.Join(state, "kube", "audit.log")
	cmd := exec.Command(auditsink, "suggest", "--no-progress", "--webhook-namespace", demoWebhookNamespace, auditLog)
	cmd.Env = append(cmd.Environ(), chdbtest.LibEnv+"="+chdbtest.LibPath())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("auditsink suggest on the demo's audit log: %v\n%s", err, stderr.Bytes())
	}
	t.Logf("auditsink suggest on the demo's audit log:\n%s", out)
	ps, err := policy.Load(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("the drafts do not load: %v", err)
	}
	byName := map[string]*v1alpha1.ConcurrencyPolicy{}
	drafts := replaytest.Drafts(t, out)
	for i := range drafts {
		byName[drafts[i].Name] = &drafts[i]
	}
	shop, legacy := byName["suggested-shop-deployments.apps"], byName["suggested-legacy-configmaps"]
	if shop == nil || legacy == nil {
		t.Fatalf("no drafts for the shop's Deployments and the legacy ConfigMaps among %v", slices.Sorted(maps.Keys(byName)))
	}
	// draft rule (policy and rule name) -> the demo policy's rule of the
	// same meaning.
	same := map[string]string{}
	for i, o := range shop.Spec.FieldOwners {
		if o.Path == "spec.replicas" {
			if !slices.Equal(o.Writers.ServiceAccounts, []string{"kube-system/horizontal-pod-autoscaler"}) || len(o.Writers.Users) > 0 {
				t.Errorf("the owner of the shop's replicas is %+v, want the autoscaler", o.Writers)
			}
			same[shop.Name+" fieldOwners["+strconv.Itoa(i)+"]"] = "shop-deployments fieldOwners[0]"
		}
	}
	for i, f := range shop.Spec.ImmutableFields {
		if f.Path == "metadata.labels.team" || f.Path == `metadata.labels["team"]` {
			same[shop.Name+" immutableFields["+strconv.Itoa(i)+"]"] = "shop-deployments immutableFields[0]"
		}
	}
	if legacy.Spec.RequireResourceVersion {
		same[legacy.Name+" requireResourceVersion"] = contention.AuditPolicyName + " requireResourceVersion"
	}
	if len(same) != 3 {
		t.Fatalf("the drafts hold %d of the 3 rules (the replicas' owner, the immutable team label, the legacy stamp): %v", len(same), same)
	}
	if !strings.Contains(replaytest.FlatComments(out), "lost updates by stampless updates of "+contention.Script) {
		t.Errorf("the stamp requirement does not name %s's stampless updates as its evidence", contention.Script)
	}

	liveRules := slices.Sorted(maps.Values(same))
	compared := map[string]int{}
	skipped := 0
	r, err := replay.New(replay.Options{Policies: policy.NewSet(ps...), ProtectedNamespaces: []string{demoWebhookNamespace},
		OnWrite: func(w *replay.Write) {
			var live, got []string
			stampRefused := false
			for _, d := range w.Live {
				if d.Rule == "requireResourceVersion" && d.Action == "Deny" {
					stampRefused = true
				}
				if slices.Contains(liveRules, d.Policy+" "+d.Rule) {
					live = append(live, d.Policy+" "+d.Rule)
				}
			}
			for _, v := range w.Violations {
				if m, ok := same[v.Policy+" "+v.RuleName()]; ok {
					got = append(got, m)
				}
			}
			for _, u := range w.Undecidable {
				if _, ok := same[u.Policy+" "+u.RuleName()]; ok && len(live) > 0 {
					t.Errorf("%s %s %s/%s by %s: the webhook decided %q, the drafts' replay cannot: %s", w.AuditID, w.Verb, w.Namespace, w.Name, w.User, live, w.Reason)
				}
			}
			if stampRefused {
				// The live webhook refused it in the stamp phase and never
				// evaluated the field rules; compare the stamp rule alone.
				got = slices.DeleteFunc(got, func(s string) bool { return !strings.HasSuffix(s, " requireResourceVersion") })
				live = slices.DeleteFunc(live, func(s string) bool { return !strings.HasSuffix(s, " requireResourceVersion") })
				skipped++
			}
			slices.Sort(got)
			slices.Sort(live)
			if !slices.Equal(got, live) {
				t.Errorf("%s %s %s %s/%s by %s (%d): the live webhook decided %q by the demo's rules, the drafts %q",
					w.AuditID, w.Verb, w.Resource, w.Namespace, w.Name, w.User, w.Code, live, got)
			}
			for _, g := range got {
				compared[g]++
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := replay.Files(t.Context(), r, []string{auditLog}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the drafts' rules decided as the live webhook's: %v (%d writes refused live in the stamp phase compared on the stamp rule only)", compared, skipped)
	for _, live := range liveRules {
		if compared[live] == 0 {
			t.Errorf("no write was decided by %s: nothing compared", live)
		}
	}
}
