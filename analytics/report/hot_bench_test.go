package report

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	"github.com/stampguard/stampguard/internal/audit"
)

// BenchmarkConflictCausesHotObject times conflict_causes on one hot object
// (as a leader-election ConfigMap or a busy status object is): n writes
// logged with their responses by four controllers, and a conflict after
// every tenth write whose stale stamp is one to three versions behind, as a
// loser's is. A cost linear in the object's writes and conflicts grows
// fourfold from the smaller size to the larger; one linear in their
// product, sixteenfold.
func BenchmarkConflictCausesHotObject(b *testing.B) {
	for _, n := range []int{20_000, 80_000} {
		b.Run(fmt.Sprintf("writes=%d", n), func(b *testing.B) {
			st, db := migrated(b)
			ctx := b.Context()
			s := &scenario{}
			for i := range n {
				at := time.Duration(i) * 40 * time.Millisecond
				s.add(at, fmt.Sprintf("controller-%d", i%4), "update", "", "configmaps", "kube-system", "hot", 200, func(r *audit.Row) {
					r.Level, r.Stamp, r.ObjectVersion, r.FullView = "RequestResponse", strconv.Itoa(i), uint64(i+1), true
				})
				if i%10 == 9 {
					stale := i + 1 - (1 + i%3)
					s.add(at+time.Millisecond, fmt.Sprintf("controller-%d", (i+1)%4), "update", "", "configmaps", "kube-system", "hot", 409,
						func(r *audit.Row) { r.Stamp = strconv.Itoa(stale) })
				}
			}
			for i := 0; i < len(s.rows); i += 10_000 {
				if _, err := st.InsertRecords(ctx, recordtest.Set(s.rows[i:min(i+10_000, len(s.rows))], nil)); err != nil {
					b.Fatal(err)
				}
			}
			o := Options{Database: db, Cluster: "c1", Top: 10, Since: t0, Until: t0.Add(time.Duration(n) * 40 * time.Millisecond), History: true}
			o.setDefaults()
			if err := o.split(ctx, st.Conn()); err != nil {
				b.Fatal(err)
			}
			q := o.querier(ctx, st.Conn())
			var conflicts uint64
			for b.Loop() {
				conflicts = 0
				var rows []ConflictCause
				if err := q.each(QueryConflictCauses, collect(&rows, func(c *ConflictCause) []any { return []any{&c.Writer, &c.BlockedBy, &c.Conflicts} })); err != nil {
					b.Fatal(err)
				}
				for _, r := range rows {
					conflicts += r.Conflicts
				}
			}
			if conflicts < uint64(n/10) {
				b.Fatalf("%d conflicts attributed, want %d at least", conflicts, n/10)
			}
		})
	}
}
