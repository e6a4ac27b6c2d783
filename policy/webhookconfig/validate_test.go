package webhookconfig

import (
	"slices"
	"testing"
)

func TestGuardedResourcesRoundTrip(t *testing.T) {
	s := FormatGuardedResources(DefaultGuardedResources)
	got, err := ParseGuardedResources(s)
	if err != nil || !slices.Equal(got, DefaultGuardedResources) {
		t.Fatalf("%q parsed to %v (%v)", s, got, err)
	}
}

// FuzzConfigFlagValues: the parsers of flag values refuse or accept, never
// panic, and accepted resources survive a round trip.
func FuzzConfigFlagValues(f *testing.F) {
	for _, s := range []string{"apps/deployments,configmaps", "ns/svc:443", "a/b/c", ",", "*", "ns/svc:0", "https://x/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if rs, err := ParseGuardedResources(s); err == nil {
			again, err := ParseGuardedResources(FormatGuardedResources(rs))
			if err != nil || !slices.Equal(again, rs) {
				t.Fatalf("%q -> %v -> %v (%v)", s, rs, again, err)
			}
		}
		if svc, err := ParseServiceReference(s); err == nil && (svc.Namespace == "" || svc.Name == "") {
			t.Fatalf("%q accepted as %+v", s, svc)
		}
		_, _ = ParseWebhookURL(s)
		_, _ = ParseFailurePolicy(s)
	})
}
