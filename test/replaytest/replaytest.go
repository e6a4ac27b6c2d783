// Package replaytest is the check that a replay equals enforcement,
// shared by the demo's test and the e2e tests: an audit log written while
// the real webhook decided, replayed at the policies that webhook
// enforced, must give every write the webhook's own decisions. It also
// reads `auditsink suggest`'s drafts for those tests.
package replaytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/replay"
)

// Result counts what EqualsEnforcement compared.
type Result struct {
	// Writes replayed in the window; Decided of them carry the webhook's
	// decisions; Undecidable of them the replay could not decide, and
	// Excused of those were decided by the webhook (undecidableOK).
	Writes, Decided, Undecidable, Excused int
	// Compared counts the decisions that matched, by rule kind and action
	// ("immutable-field Deny"), to show what the comparison covered.
	Compared map[string]int
}

// EqualsEnforcement replays logs with o (OnWrite is its own) and requires
// for every write the decisions (policy, rule, action) the webhook
// recorded in its audit annotations: the same ones where it decided, none
// where it did not, and no write it decided left undecidable unless
// undecidableOK (nil: none) excuses it, for a log known not to hold what
// that write needs. It fails t
// when the logs hold no write the webhook decided (nothing compared). It
// returns the replayer, whose report callers may compare further.
func EqualsEnforcement(t testing.TB, o replay.Options, undecidableOK func(*replay.Write) bool, logs ...string) (*replay.Replayer, Result) {
	t.Helper()
	res := Result{Compared: map[string]int{}}
	o.OnWrite = func(w *replay.Write) {
		res.Writes++
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
			res.Decided++
		}
		if len(w.Undecidable) > 0 {
			res.Undecidable++
			if len(live) > 0 && undecidableOK != nil && undecidableOK(w) {
				res.Excused++
				t.Logf("%s %s %s/%s by %s: the webhook decided %q, the log cannot: %s", w.AuditID, w.Verb, w.Namespace, w.Name, w.User, live, w.Reason)
			} else if len(live) > 0 {
				t.Errorf("%s %s %s/%s by %s (%d): the webhook decided %q, the replay found it undecidable: %s",
					w.AuditID, w.Verb, w.Namespace, w.Name, w.User, w.Code, live, w.Reason)
			}
			return
		}
		if !slices.Equal(got, live) {
			t.Errorf("%s %s %s %s/%s by %s (%d): the webhook decided %q, the replay %q",
				w.AuditID, w.Verb, w.Resource, w.Namespace, w.Name, w.User, w.Code, live, got)
			return
		}
		for _, v := range w.Violations {
			res.Compared[string(v.Rule)+" "+string(v.Action)]++
		}
	}
	r, err := replay.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := replay.Files(t.Context(), r, logs); err != nil {
		t.Fatal(err)
	}
	t.Logf("replayed %d writes of %q: %d decided by the webhook, %d undecidable (%d of those decided, excused); compared %v",
		res.Writes, logs, res.Decided, res.Undecidable, res.Excused, res.Compared)
	if res.Decided == 0 || res.Writes == 0 {
		t.Fatalf("the logs hold %d writes, %d of them decided by the webhook: nothing was compared", res.Writes, res.Decided)
	}
	return r, res
}

// CommandPrintsReport runs the built webhook binary with args (a `replay`
// command line with `--format json`) and requires it to print want, the
// library's report over the same logs and options (trimmed to the
// command's --top). It returns the report printed.
func CommandPrintsReport(t testing.TB, want *replay.Report, webhookBin string, args ...string) *replay.Report {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), webhookBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("webhook %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var got replay.Report
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("webhook %s printed no report: %v\n%s", strings.Join(args, " "), err, out)
	}
	wantJSON, _ := json.MarshalIndent(want, "", "  ")
	gotJSON, _ := json.MarshalIndent(&got, "", "  ")
	if !bytes.Equal(wantJSON, gotJSON) {
		t.Errorf("webhook %s differs from the library's report\nwant %s\ngot  %s", strings.Join(args, " "), wantJSON, gotJSON)
	}
	return &got
}

// Drafts decodes the ConcurrencyPolicies of a multi-document YAML stream
// (`auditsink suggest`'s drafts), comments and empty documents skipped.
func Drafts(t testing.TB, yaml []byte) []v1alpha1.ConcurrencyPolicy {
	t.Helper()
	var out []v1alpha1.ConcurrencyPolicy
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(yaml), 4096)
	for {
		var p v1alpha1.ConcurrencyPolicy
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("the drafts: %v\n%s", err, yaml)
		}
		if p.Name != "" {
			out = append(out, p)
		}
	}
}

// FlatComments is the text with comment marks and line breaks gone, so
// that a sentence wrapped over comment lines reads whole.
func FlatComments(yaml []byte) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(string(yaml), "#", "")), " ")
}
