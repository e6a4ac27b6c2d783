package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sink's Prometheus metrics. A nil *Metrics records nothing.
// The names are a contract with the dashboards and alert rules; each is
// documented in docs/auditsink.md.
type Metrics struct {
	// Accepted counts events taken in, by source (webhook, tail): for the
	// webhook, the events of batches answered 200, counted once per
	// answer (an apiserver retry after a 503 is counted when it succeeds).
	Accepted       *prometheus.CounterVec
	Skipped        prometheus.Counter     // events of stages not stored, of answered batches
	DeadLettered   *prometheus.CounterVec // inputs rejected, by source, of answered batches
	BatchesRefused *prometheus.CounterVec // webhook batches answered non-2xx, by reason
	Stored         prometheus.Counter     // rows inserted into ClickHouse
	Deduplicated   prometheus.Counter     // rows dropped as repeated within a batch
	SpoolBytes     prometheus.Gauge       // spool bytes on disk
	FlushSeconds   prometheus.Histogram   // time of one ClickHouse insert
	// CHErrors counts failed ClickHouse attempts by op: insert, migrate,
	// retention, compaction.
	CHErrors *prometheus.CounterVec
	// TailLostBytes counts bytes a copytruncate rotation destroyed before
	// tail read them.
	TailLostBytes prometheus.Counter
	// LostUpdates is serve's last count of lost updates, by cluster,
	// namespace and cause (countLostEvery).
	LostUpdates *prometheus.GaugeVec
	// Signals are the live conflict counters of accepted webhook batches
	// (the storm alerts' input), with the default bounds.
	Signals *Signals
}

// ClickHouse operations, the op label of auditsink_clickhouse_errors_total.
const (
	OpInsert    = "insert"
	OpMigrate   = "migrate"
	OpRetention = "retention"
	OpCompact   = "compaction"
	// OpLostUpdates is serve's periodic count of lost updates.
	OpLostUpdates = "lost_updates"
)

// Reasons a webhook batch is refused, the reason label of
// auditsink_batches_refused_total.
const (
	RefusedUnauthorized = "unauthorized"
	RefusedBadRequest   = "bad_request"   // not an EventList, unreadable, bad cluster name or encoding
	RefusedTooLarge     = "too_large"     // body above the limit
	RefusedTooSlow      = "too_slow"      // body arrived below the minimum rate
	RefusedSpoolFull    = "spool_full"    // 503: the spool is at its size limit
	RefusedShutdown     = "shutting_down" // 503, or a body cut by the shutdown
	RefusedSpoolError   = "spool_error"   // 500: the spool failed
)

// NewMetrics creates the metrics and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditsink_events_accepted_total", Help: "Audit events accepted for storage, by source (webhook: in batches answered 200; tail).",
		}, []string{"source"}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_events_skipped_total", Help: "Audit events of stages that are not stored.",
		}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditsink_events_dead_lettered_total", Help: "Inputs that could not become rows and went to dead_letters.",
		}, []string{"source"}),
		BatchesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditsink_batches_refused_total", Help: "Webhook batches answered non-2xx (nothing of them acknowledged), by reason.",
		}, []string{"reason"}),
		Stored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_events_stored_total", Help: "Rows inserted into the events table.",
		}),
		Deduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_events_deduplicated_total", Help: "Events dropped because they were repeated within one insert (a copy stored earlier is dropped by the reads, not here).",
		}),
		SpoolBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "auditsink_spool_bytes", Help: "Bytes of spool segments on disk (set on every append and confirm).",
		}),
		FlushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "auditsink_flush_duration_seconds", Help: "Time of one ClickHouse insert.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		CHErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditsink_clickhouse_errors_total", Help: "Failed ClickHouse attempts (each is retried), by op: insert, migrate, retention, compaction, lost_updates.",
		}, []string{"op"}),
		TailLostBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_tail_lost_bytes_total", Help: "Bytes of a followed log destroyed by a copytruncate rotation before tail read them.",
		}),
	}
	m.LostUpdates = newLostUpdates()
	m.Signals = NewSignals(reg, SignalOptions{})
	for _, op := range []string{OpInsert, OpMigrate, OpRetention, OpCompact, OpLostUpdates} {
		m.CHErrors.WithLabelValues(op) // export zeros, so that rate() sees the first error
	}
	if reg != nil {
		reg.MustRegister(m.Accepted, m.Skipped, m.DeadLettered, m.BatchesRefused, m.Stored, m.Deduplicated,
			m.SpoolBytes, m.FlushSeconds, m.CHErrors, m.TailLostBytes, m.LostUpdates)
	}
	return m
}

// CountAccepted records what one answered batch (or one tail flush) took
// in.
func (m *Metrics) CountAccepted(source string, res AcceptResult) {
	if m == nil {
		return
	}
	m.Accepted.WithLabelValues(source).Add(float64(res.Accepted))
	m.Skipped.Add(float64(res.Skipped))
	m.DeadLettered.WithLabelValues(source).Add(float64(res.Rejected))
}

// CountSignals commits one accepted webhook batch's tally of cluster.
func (m *Metrics) CountSignals(cluster string, t *Tally) {
	if m == nil {
		return
	}
	m.Signals.Commit(cluster, t)
}

// CountCHError records a failed ClickHouse attempt of op.
func (m *Metrics) CountCHError(op string, _ error) {
	if m == nil {
		return
	}
	m.CHErrors.WithLabelValues(op).Inc()
}
