package workload

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
)

// The webhooks' names as the apiserver quotes them in a refusal.
const (
	stampWebhook  = `admission webhook "stamp.stampguard.dev" denied the request: `
	fieldsWebhook = `admission webhook "fields.stampguard.dev" denied the request: `
)

var (
	// The stamp webhook names every refusing policy once:
	// ConcurrencyPolicy "a", "b": metadata.resourceVersion: Invalid value ...
	reStampDenial = regexp.MustCompile(`ConcurrencyPolicy ((?:"[^"]*"(?:, )?)+): metadata\.resourceVersion: Invalid value`)
	reQuoted      = regexp.MustCompile(`"([^"]*)"`)
	// The fields webhook writes one sentence per violated rule.
	reFieldDenial = regexp.MustCompile(`ConcurrencyPolicy "([^"]*)": (?:\S+ is (owned by|immutable)|(deletes) of )`)
)

// Refusals are the policy decisions a refused request carries, read from
// the answer the client got: the webhook names each policy and rule it
// denied for. Nil for a request stampguard did not refuse.
func Refusals(r Request) []report.PolicyDecisions {
	var out []report.PolicyDecisions
	switch {
	case r.Code == 422 && strings.Contains(r.Message, stampWebhook):
		if m := reStampDenial.FindStringSubmatch(r.Message); m != nil {
			for _, q := range reQuoted.FindAllStringSubmatch(m[1], -1) {
				out = append(out, report.PolicyDecisions{Policy: q[1], Kind: "stamp-missing", Action: "deny", Count: 1})
			}
		}
	case r.Code == 422 && strings.Contains(r.Message, fieldsWebhook):
		for _, m := range reFieldDenial.FindAllStringSubmatch(r.Message, -1) {
			kind := map[string]string{"owned by": "field-owner", "immutable": "immutable-field", "deletes": "delete-precondition"}[m[2]+m[3]]
			out = append(out, report.PolicyDecisions{Policy: m[1], Kind: kind, Action: "deny", Count: 1})
		}
	}
	return out
}

// PolicyDecisions is the report's policy_decisions section for requests
// that met stampguard's webhook: the refusals as Refusals reads them from
// the answers, plus what audited says for each request. Audit (and Warn)
// decisions leave the request allowed, so the client sees no refusal;
// audited gives them from what the client sent (the policies' non-Deny
// rules applied to the request). It may be nil. Only requests whose Start
// lies in [since, until) count, dry runs never do. Sorted as the report
// sorts: count desc, then policy, kind, action.
func PolicyDecisions(reqs []Request, since, until time.Time, audited func(Request) []report.PolicyDecisions) []report.PolicyDecisions {
	type key struct{ policy, kind, action string }
	counts := map[key]uint64{}
	for _, r := range reqs {
		if r.DryRun || r.Start.Before(since) || !r.Start.Before(until) {
			continue
		}
		ds := Refusals(r)
		if audited != nil {
			ds = append(ds, audited(r)...)
		}
		for _, d := range ds {
			counts[key{d.Policy, d.Kind, d.Action}] += d.Count
		}
	}
	out := []report.PolicyDecisions{}
	for k, n := range counts {
		out = append(out, report.PolicyDecisions{Policy: k.policy, Kind: k.kind, Action: k.action, Count: n})
	}
	slices.SortFunc(out, func(a, b report.PolicyDecisions) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Action, b.Action))
	})
	return out
}
