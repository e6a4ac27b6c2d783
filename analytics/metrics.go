package analytics

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the sink's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	Received     *prometheus.CounterVec // events decoded, by source
	Skipped      prometheus.Counter     // events of stages not stored
	DeadLettered *prometheus.CounterVec // inputs rejected, by source
	Stored       prometheus.Counter     // rows inserted into ClickHouse
	Deduplicated prometheus.Counter     // rows dropped as already stored
	SpoolBytes   prometheus.Gauge       // spool bytes on disk
	FlushSeconds prometheus.Histogram   // time of one ClickHouse insert
	CHErrors     prometheus.Counter     // failed ClickHouse inserts
}

// NewMetrics creates the metrics and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditsink_events_received_total", Help: "Audit events decoded, by source (webhook, file, tail).",
		}, []string{"source"}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_events_skipped_total", Help: "Audit events of stages that are not stored.",
		}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditsink_events_dead_lettered_total", Help: "Inputs that could not become rows and went to dead_letters.",
		}, []string{"source"}),
		Stored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_events_stored_total", Help: "Rows inserted into the events table.",
		}),
		Deduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_events_deduplicated_total", Help: "Events dropped because they were stored before (retries, replays, repeated ingests).",
		}),
		SpoolBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "auditsink_spool_bytes", Help: "Bytes of spool segments on disk.",
		}),
		FlushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "auditsink_flush_duration_seconds", Help: "Time of one ClickHouse insert (dedup lookup included).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		CHErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditsink_clickhouse_errors_total", Help: "ClickHouse operations that failed (and were retried).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Received, m.Skipped, m.DeadLettered, m.Stored, m.Deduplicated, m.SpoolBytes, m.FlushSeconds, m.CHErrors)
	}
	return m
}
