package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/replay"
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
	var writes, decided, undecidable int
	r, err := replay.New(replay.Options{
		Policies: policy.NewSet(ps...), ProtectedNamespaces: []string{demoWebhookNamespace},
		OnWrite: func(w *replay.Write) {
			writes++
			var got, live []string
			for _, v := range w.Violations {
				got = append(got, v.Policy+" "+v.RuleName()+" "+string(v.Action))
			}
			for _, d := range w.Live {
				live = append(live, d.Policy+" "+d.Rule+" "+d.Action)
			}
			slices.Sort(got)
			slices.Sort(live)
			if len(live) > 0 {
				decided++
			}
			if len(w.Undecidable) > 0 {
				undecidable++
				if len(live) > 0 {
					t.Errorf("%s %s %s/%s by %s (%d): the webhook decided %q, the replay found it undecidable: %s",
						w.AuditID, w.Verb, w.Namespace, w.Name, w.User, w.Code, live, w.Reason)
				}
				return
			}
			if !slices.Equal(got, live) {
				t.Errorf("%s %s %s %s/%s by %s (%d): the webhook decided %q, the replay %q",
					w.AuditID, w.Verb, w.Resource, w.Namespace, w.Name, w.User, w.Code, live, got)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := replay.Files(t.Context(), r, []string{auditLog}); err != nil {
		t.Fatal(err)
	}
	want := r.Report()
	want.Trim(replay.DefaultTop)
	t.Logf("replayed %d writes of %s: %d decided by the webhook, %d undecidable", writes, auditLog, decided, undecidable)
	if decided == 0 || writes == 0 {
		t.Fatalf("the log holds %d writes, %d of them decided by the webhook: nothing was compared", writes, decided)
	}

	cmd := exec.CommandContext(t.Context(), webhookBin, "replay", "--policy-file", policies, "--namespace", demoWebhookNamespace, "--format", "json", auditLog)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("webhook replay: %v\n%s", err, stderr.String())
	}
	var got replay.Report
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("webhook replay --format json printed no report: %v\n%s", err, out)
	}
	wantJSON, _ := json.MarshalIndent(want, "", "  ")
	gotJSON, _ := json.MarshalIndent(&got, "", "  ")
	if !bytes.Equal(wantJSON, gotJSON) {
		t.Errorf("webhook replay --format json differs from the library's report\nwant %s\ngot  %s", wantJSON, gotJSON)
	}
	if len(got.Refused) == 0 || !strings.Contains(got.Refused[0].Message, "ConcurrencyPolicy") {
		t.Errorf("no refused write with the webhook's message: %+v", got.Refused)
	}
}

// demoWebhookNamespace is the --namespace the demo gives the webhook.
const demoWebhookNamespace = "stampguard-system"
