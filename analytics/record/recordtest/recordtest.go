// Package recordtest turns audit rows into a record.Set for tests: the
// product encodes records as it decodes events (pipeline.Accepter); a test
// that holds rows encodes them here, through the same AppendRow and
// Set.Add, and stores them with the store's one insert, InsertRecords.
package recordtest

import (
	"fmt"

	"github.com/stampguard/stampguard/analytics/record"
	"github.com/stampguard/stampguard/internal/audit"
)

// Set encodes rows and dead letters into records, one per cluster, and
// parses them into a set. A record that does not parse back is a bug of
// the record format, and panics.
func Set(rows []audit.Row, dead []audit.DeadLetter) *record.Set {
	recs := map[string][]byte{}
	var order []string
	rec := func(cluster string) []byte {
		r, ok := recs[cluster]
		if !ok {
			r = record.AppendHeader(nil, cluster)
			order = append(order, cluster)
		}
		return r
	}
	for i := range rows {
		recs[rows[i].Cluster] = record.AppendRow(rec(rows[i].Cluster), &rows[i])
	}
	for i := range dead {
		recs[dead[i].Cluster] = record.AppendDeadLetter(rec(dead[i].Cluster), &dead[i])
	}
	set := record.NewSet(len(rows))
	for _, c := range order {
		if err := set.Add(string(recs[c])); err != nil {
			panic(fmt.Sprintf("recordtest: a record of cluster %q does not parse back: %v", c, err))
		}
	}
	return set
}
