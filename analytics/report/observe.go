package report

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Observations are what the field history and the events say about who
// writes what, whole (no list is cut at Top): the input of the policy
// drafts of `auditsink suggest` (analytics/suggest).
type Observations struct {
	// Writers are every writer of every field (asql.FieldOwnership, as
	// asql.FieldWriters counts them).
	Writers []FieldWriter
	// Fields are every field the history shows (asql.FieldStability).
	Fields []FieldSeen
	// LostUpdates are the lost updates of the window by a stampless
	// update (asql.FieldOwnership, as asql.LostUpdates finds them; without
	// the overwritten change's audit ID and time).
	LostUpdates []LostUpdate
	// NameReuses are the kinds whose names were deleted and created again
	// by another writer (asql.NameReuse).
	NameReuses []NameReuse
}

// FieldSeen is how much the history saw of one field of a kind in a
// namespace: Objects whose versions show it, Versions that show it,
// Created the creations that set it, KindObjects the objects of the kind
// and namespace the history shows whole.
type FieldSeen struct {
	APIGroup    string `json:"api_group"`
	Resource    string `json:"resource"`
	Namespace   string `json:"namespace"`
	Field       string `json:"field"`
	Objects     uint64 `json:"objects"`
	Versions    uint64 `json:"versions"`
	Created     uint64 `json:"created"`
	KindObjects uint64 `json:"kind_objects"`
	First       string `json:"first"`
	Last        string `json:"last"`
}

// NameReuse counts the names of a kind in a namespace that were deleted
// and then created again by another writer than the deleter.
type NameReuse struct {
	APIGroup  string   `json:"api_group"`
	Resource  string   `json:"resource"`
	Namespace string   `json:"namespace"`
	Reuses    uint64   `json:"reuses"`
	Names     uint64   `json:"names"`
	Deleters  []string `json:"deleters"`
	Creators  []string `json:"creators"`
	First     string   `json:"first"`
	Last      string   `json:"last"`
}

// Observe reads the Observations of o's window and filters, whole: its
// statements have no @top. It reads the history raw, as the report's
// history sections do.
func Observe(ctx context.Context, conn driver.Conn, o Options) (*Observations, error) {
	o.setDefaults()
	if !o.Since.Before(o.Until) {
		return nil, fmt.Errorf("empty window: since %s is not before until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	if err := asql.ValidDatabase(o.Database); err != nil {
		return nil, err
	}
	obs := &Observations{Writers: []FieldWriter{}, Fields: []FieldSeen{}, LostUpdates: []LostUpdate{}, NameReuses: []NameReuse{}}
	err := o.querier(ctx, conn).parallel(o.parallel,
		run{asql.FieldOwnership, func(rows driver.Rows) error {
			var f FieldWriter
			var first, last uint64
			var times []uint64
			var ids, names, overwritten []string
			if err := rows.Scan(&f.APIGroup, &f.Resource, &f.Namespace, &f.Field, &f.Writer, &f.Changes, &f.Objects, &first, &last,
				&times, &ids, &names, &overwritten); err != nil {
				return err
			}
			f.First, f.Last = microsTime(first), microsTime(last)
			obs.Writers = append(obs.Writers, f)
			for i := range times {
				obs.LostUpdates = append(obs.LostUpdates, LostUpdate{APIGroup: f.APIGroup, Resource: f.Resource, Namespace: f.Namespace, Name: names[i],
					Field: f.Field, Writer: f.Writer, OverwrittenWriter: overwritten[i], Cause: "stampless", AuditID: ids[i], Time: microsTime(times[i])})
			}
			return nil
		}},
		run{asql.FieldStability, func(rows driver.Rows) error {
			var f FieldSeen
			var first, last uint64
			err := rows.Scan(&f.APIGroup, &f.Resource, &f.Namespace, &f.Field, &f.Objects, &f.Versions, &f.Created, &f.KindObjects, &first, &last)
			f.First, f.Last = microsTime(first), microsTime(last)
			obs.Fields = append(obs.Fields, f)
			return err
		}},
		run{asql.NameReuse, func(rows driver.Rows) error {
			var n NameReuse
			var first, last uint64
			err := rows.Scan(&n.APIGroup, &n.Resource, &n.Namespace, &n.Reuses, &n.Names, &n.Deleters, &n.Creators, &first, &last)
			n.First, n.Last = microsTime(first), microsTime(last)
			obs.NameReuses = append(obs.NameReuses, n)
			return err
		}},
	)
	if err != nil {
		return nil, err
	}
	return obs, nil
}
