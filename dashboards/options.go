package dashboards

import (
	"fmt"
	"time"
)

// Options are the generator's parameters. Zero values take the defaults
// stated on each field (setDefaults).
type Options struct {
	// Database is the ClickHouse database the sink writes (auditsink
	// --database). Defaults to "stampguard".
	Database string
	// Folder is the Grafana folder of the dashboards and alert rules.
	// Defaults to "stampguard".
	Folder string
	// Top bounds every table. Defaults to 20.
	Top int
	// LoopGap is the longest pause inside a retry loop, as the report's
	// --loop-gap. Defaults to 5m.
	LoopGap time.Duration
	// LoopThreshold is the fewest version conflicts that make a retry
	// loop, as the report's --loop-threshold. Defaults to 5.
	LoopThreshold int
	// FightHandoffs is the fewest handoffs of a field between writers
	// that make a field fight, as the report's --fight-handoffs. Defaults
	// to 3.
	FightHandoffs int
	// BaselineConflictRate is the healthy version-conflict rate: the
	// threshold line on the rate panels. Defaults to 0.02 (2 % of writes).
	BaselineConflictRate float64
	// MinBucketWrites is the fewest write attempts in a bucket of the
	// conflict-rate series for it to show a rate. Defaults to 10.
	MinBucketWrites int
	// Alerts are the alert rules' parameters.
	Alerts AlertOptions
}

// AlertOptions are the alert rules' parameters.
type AlertOptions struct {
	// ClickHouseUID and PrometheusUID are the data source UIDs the rules
	// query (alert rules cannot use a datasource variable). Default
	// "clickhouse" and "prometheus".
	ClickHouseUID, PrometheusUID string
	// Cluster is the source cluster the ClickHouse rules watch (auditsink
	// --cluster). Defaults to "default", the sink's own default.
	Cluster string
	// Interval is how often the rules are evaluated. Defaults to 1m.
	Interval time.Duration
	// IngestLag is how far behind now each ClickHouse window ends, so that
	// events still on their way through the apiserver's audit backend and
	// the sink's spool are not missed. Defaults to 1m.
	IngestLag time.Duration

	// StormRate is the conflict-storm threshold: the version-conflict rate
	// over StormWindow. Default 0.2 (a fifth of the writes).
	StormRate float64
	// StormWindow is the window of the conflict rate. Defaults to 10m.
	StormWindow time.Duration
	// StormFor is how long the rate must stay above StormRate. Defaults to 5m.
	StormFor time.Duration
	// MinWrites is the fewest write attempts in a window for its conflict
	// rate to count (else it is 0). Defaults to 50.
	MinWrites int

	// ClimbFactor is the climbing-conflicts threshold: the rate over
	// StormWindow now above ClimbFactor times the rate over the same
	// window an hour earlier. Defaults to 3.
	ClimbFactor float64
	// ClimbMinRate is the lowest current rate that can climb (so that 0.1 %
	// after 0.01 % stays quiet). Defaults to 0.05.
	ClimbMinRate float64
	// ClimbBaseline is the window before StormWindow whose rate the
	// current one is compared with; it needs MinWrites write attempts, or
	// the rule stays quiet (a quiet night's rate is no baseline).
	// Defaults to 1h.
	ClimbBaseline time.Duration

	// LoopStale is how long after its last conflict an unresolved retry
	// loop alerts. Defaults to 15m.
	LoopStale time.Duration
	// LoopLookback is the window the retry-loop rule searches, from the
	// hour caches for its compacted hours: a loop fires until its writer
	// succeeds on the object, or until its conflicts are older than this.
	// Defaults to 7 days (168h).
	LoopLookback time.Duration

	// AuditWindow is the window of the stampless-writes-under-Audit rule:
	// it fires on any such write in it. Defaults to 15m.
	AuditWindow time.Duration

	// LostWindow is the window of the lost-updates rule: it fires while a
	// lost update is in it. Defaults to 1h.
	LostWindow time.Duration

	// InsertLag is the health dashboard's threshold on the age of the
	// sink's oldest unconfirmed spool record
	// (auditsink_spool_oldest_unconfirmed_seconds): the chart's
	// AuditsinkInsertLag alert's default (prometheusRule.insertLagSeconds),
	// which pages on it; no Grafana rule does. Defaults to 2m.
	InsertLag time.Duration
	// SpoolGrowth is the spool growth over 15 minutes, in bytes, that
	// alerts (ClickHouse is not keeping up). Defaults to 256 MiB.
	SpoolGrowth float64
}

func (o *Options) setDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defNum := func(f *float64, v float64) {
		if *f <= 0 {
			*f = v
		}
	}
	def(&o.Database, "stampguard")
	def(&o.Folder, "stampguard")
	if o.Top <= 0 {
		o.Top = 20
	}
	defDur(&o.LoopGap, 5*time.Minute)
	if o.LoopThreshold <= 0 {
		o.LoopThreshold = 5
	}
	if o.FightHandoffs <= 0 {
		o.FightHandoffs = 3
	}
	defNum(&o.BaselineConflictRate, 0.02)
	if o.MinBucketWrites <= 0 {
		o.MinBucketWrites = 10
	}
	a := &o.Alerts
	def(&a.ClickHouseUID, "clickhouse")
	def(&a.PrometheusUID, "prometheus")
	def(&a.Cluster, "default")
	defDur(&a.Interval, time.Minute)
	defDur(&a.IngestLag, time.Minute)
	defNum(&a.StormRate, 0.2)
	defDur(&a.StormWindow, 10*time.Minute)
	defDur(&a.StormFor, 5*time.Minute)
	if a.MinWrites <= 0 {
		a.MinWrites = 50
	}
	defNum(&a.ClimbFactor, 3)
	defNum(&a.ClimbMinRate, 0.05)
	defDur(&a.LoopStale, 15*time.Minute)
	defDur(&a.ClimbBaseline, time.Hour)
	defDur(&a.LoopLookback, 7*24*time.Hour)
	defDur(&a.AuditWindow, 15*time.Minute)
	defDur(&a.LostWindow, time.Hour)
	defDur(&a.InsertLag, 2*time.Minute)
	defNum(&a.SpoolGrowth, 256<<20)
}

// duration writes d as Grafana and Prometheus read durations: "90s",
// "5m", "2h".
func duration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	default:
		return fmt.Sprintf("%ds", d/time.Second)
	}
}
