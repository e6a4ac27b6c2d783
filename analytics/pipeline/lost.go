package pipeline

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/analytics/store"
)

// The defaults of LostUpdateOptions (and of serve's flags).
const (
	// DefaultLostUpdatesEvery is how often serve counts the lost updates.
	DefaultLostUpdatesEvery = time.Minute
	// DefaultLostUpdatesWindow is how far back each count looks: the
	// Grafana rule's window (dashboards.AlertOptions.LostWindow) too.
	DefaultLostUpdatesWindow = time.Hour
)

// LostUpdateOptions configure serve's count of lost updates, the gauge
// auditsink_lost_updates that the chart's StampguardLostUpdates alert
// reads.
type LostUpdateOptions struct {
	// Every is how often the count runs; 0 runs none (the gauge stays
	// empty).
	Every time.Duration
	// Window is how far back each count looks; defaulted to
	// DefaultLostUpdatesWindow.
	Window time.Duration
}

// newLostUpdates is the gauge of the last count, by cluster, namespace and
// cause. A series exists while its count is above zero.
func newLostUpdates() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "auditsink_lost_updates",
		Help: "Lost updates (docs/auditsink.md, \"Lost updates\") over the last --lost-updates-window, by cluster, namespace and cause, as the field history in ClickHouse showed them at the last count: the same statement as the report's."},
		[]string{"cluster", "namespace", "cause"})
}

// countLostEvery counts, now and then every o.Every until ctx is done,
// the lost updates of the last o.Window of each cluster the sink has taken
// webhook batches of (Signals.Clusters), with the report's statement
// (report.LostUpdatesByNamespace). A failed count is logged and keeps the
// cluster's last figures until the next one succeeds.
func countLostEvery(ctx context.Context, st *store.Store, o LostUpdateOptions, m *Metrics, log *slog.Logger) {
	if o.Window <= 0 {
		o.Window = DefaultLostUpdatesWindow
	}
	every(ctx, o.Every, func() {
		now := time.Now()
		for _, cluster := range m.Signals.Clusters() {
			counts, err := report.LostUpdatesByNamespace(ctx, st.Conn(), report.Options{Database: st.Database(), Cluster: cluster,
				Since: now.Add(-o.Window), Until: now})
			if err != nil {
				if ctx.Err() == nil {
					m.CountCHError(OpLostUpdates, err)
					log.Warn("counting the lost updates failed; auditsink_lost_updates keeps the last count", "cluster", cluster, "err", err, "retryIn", o.Every.String())
				}
				continue
			}
			m.LostUpdates.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
			for _, c := range counts {
				m.LostUpdates.WithLabelValues(cluster, c.Namespace, c.Cause).Set(float64(c.Lost))
			}
		}
	})
}

// Clusters are the clusters the signals have counted, sorted, without
// OtherLabel.
func (s *Signals) Clusters() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var cs []string
	for c := range s.clusters {
		if c != OtherLabel {
			cs = append(cs, c)
		}
	}
	slices.Sort(cs)
	return cs
}
