package report

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// LostCount is how many lost updates one namespace had, by one cause.
type LostCount struct {
	Namespace string `json:"namespace"`
	Cause     string `json:"cause"`
	Lost      uint64 `json:"lost"`
}

// LostUpdatesByNamespace counts the lost updates of o's window by
// namespace and cause (asql.LostUpdatesByNamespace): what the sink's
// gauge auditsink_lost_updates shows and the chart's alert pages on. Only
// o's database, cluster, window and filters matter.
func LostUpdatesByNamespace(ctx context.Context, conn driver.Conn, o Options) ([]LostCount, error) {
	o.setDefaults()
	if !o.Since.Before(o.Until) {
		return nil, fmt.Errorf("empty window: since %s is not before until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	if err := asql.ValidDatabase(o.Database); err != nil {
		return nil, err
	}
	var counts []LostCount
	err := o.querier(ctx, conn).each(asql.LostUpdatesByNamespace, collect(&counts, func(c *LostCount) []any {
		return []any{&c.Namespace, &c.Cause, &c.Lost}
	}))
	return counts, err
}
