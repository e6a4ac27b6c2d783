package suggest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/replay"
)

// ReplayOptions are what the drafts are replayed with: the audit log
// files and window they were drafted from, and the webhook's settings.
type ReplayOptions struct {
	Files        []string
	Since, Until time.Time
	// ProtectedNamespaces and BreakGlassGroup are replay.Options'.
	ProtectedNamespaces []string
	BreakGlassGroup     string
}

// Policies parses the drafts as Write writes them, as a user's `kubectl
// apply` and the webhook would: the text is what is checked.
func Policies(drafts []Draft) (*policy.Set, error) {
	var buf bytes.Buffer
	if err := Write(&buf, Header{Options: DefaultOptions()}, drafts); err != nil {
		return nil, err
	}
	ps, err := policy.Load(&buf)
	if err != nil {
		return nil, fmt.Errorf("the drafts do not load as policies (a bug): %w", err)
	}
	return policy.NewSet(ps...), nil
}

type ruleKey struct {
	policy string
	kind   policy.RuleKind
	index  int
}

// Replay replays the drafts over o's files with `webhook replay`'s engine
// and records in each rule what it would have refused and what the log
// cannot decide.
func Replay(ctx context.Context, drafts []Draft, o ReplayOptions) error {
	if len(drafts) == 0 {
		return nil
	}
	set, err := Policies(drafts)
	if err != nil {
		return err
	}
	type tallies struct {
		r                *Replayed
		writers, reasons map[string]uint64
	}
	rules := map[ruleKey]*tallies{}
	add := func(name string, kind policy.RuleKind, index int, r *Replayed) {
		rules[ruleKey{name, kind, index}] = &tallies{r: r, writers: map[string]uint64{}, reasons: map[string]uint64{}}
	}
	for i := range drafts {
		d := &drafts[i]
		if d.Stamp != nil {
			add(d.Name, policy.RuleStampMissing, -1, &d.Stamp.Replay)
		}
		if d.Delete != nil {
			add(d.Name, policy.RuleDeletePrecondition, -1, &d.Delete.Replay)
		}
		for j := range d.Owners {
			add(d.Name, policy.RuleFieldOwner, j, &d.Owners[j].Replay)
		}
		for j := range d.Immutable {
			add(d.Name, policy.RuleImmutableField, j, &d.Immutable[j].Replay)
		}
	}
	seen := map[ruleKey]bool{}
	r, err := replay.New(replay.Options{Policies: set, ProtectedNamespaces: o.ProtectedNamespaces, BreakGlassGroup: o.BreakGlassGroup,
		Since: o.Since, Until: o.Until, OnWrite: func(w *replay.Write) {
			clear(seen)
			for _, v := range w.Violations {
				k := ruleKey{v.Policy, v.Rule, v.Index}
				if t := rules[k]; t != nil && !seen[k] {
					seen[k] = true
					t.r.Refused++
					t.writers[w.User]++
				}
			}
			for _, u := range w.Undecidable {
				k := ruleKey{u.Policy, u.Rule, u.Index}
				if t := rules[k]; t != nil && !seen[k] {
					seen[k] = true
					t.r.Undecidable++
					t.reasons[reasonClass(w.Reason)]++
				}
			}
		}})
	if err != nil {
		return err
	}
	if err := replay.Files(ctx, r, o.Files); err != nil {
		return fmt.Errorf("replay the drafts: %w", err)
	}
	for _, t := range rules {
		t.r.Done = true
		t.r.Writers, t.r.Reasons = counts(t.writers), counts(t.reasons)
	}
	return nil
}

// reasonClass is an undecidable write's reason with its numbers (the
// resourceVersion it names) as N, so that the writes of one cause count
// together.
func reasonClass(reason string) string {
	var b strings.Builder
	digits := false
	for _, r := range reason {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}
