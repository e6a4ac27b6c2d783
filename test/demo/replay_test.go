package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/replay"
	"github.com/stampguard/stampguard/test/replaytest"
)

// replayEqualsEnforcement replays the demo's policies over the demo's own
// audit log, written while the real webhook decided, and requires for
// every write the decisions (policy, rule, action) the webhook recorded in
// its audit annotations: the same ones where it decided, none where it did
// not, and no write it decided left undecidable. Then the built `webhook
// replay --format json` must print the report the library computed.
func replayEqualsEnforcement(t *testing.T, root, webhookBin, state string) {
	t.Helper()
	policies := filepath.Join(root, "examples", "demo-policies.yaml")
	auditLog := filepath.Join(state, "kube", "audit.log")
	ps, err := policy.LoadFile(policies)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := replaytest.EqualsEnforcement(t, replay.Options{
		Policies: policy.NewSet(ps...), ProtectedNamespaces: []string{demoWebhookNamespace},
	}, nil, auditLog)
	want := r.Report()
	want.Trim(replay.DefaultTop)

	got := replaytest.CommandPrintsReport(t, want, webhookBin,
		"replay", "--policy-file", policies, "--namespace", demoWebhookNamespace, "--format", "json", auditLog)
	if len(got.Refused) == 0 || !strings.Contains(got.Refused[0].Message, "ConcurrencyPolicy") {
		t.Errorf("no refused write with the webhook's message: %+v", got.Refused)
	}
}

// demoWebhookNamespace is the --namespace the demo gives the webhook.
const demoWebhookNamespace = "stampguard-system"
