package admissiontest

import (
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// CompileSet compiles the policies into one set, failing the test if any
// does not compile.
func CompileSet(t testing.TB, ps ...*v1alpha1.ConcurrencyPolicy) *policy.Set {
	t.Helper()
	var out []*policy.Policy
	for _, p := range ps {
		c, err := policy.Compile(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return policy.NewSet(out...)
}

// ConditionNames are the names of a webhook's match conditions, in order.
func ConditionNames(cs []admissionregistrationv1.MatchCondition) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
