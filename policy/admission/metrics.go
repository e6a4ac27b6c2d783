package admission

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the series of answering reviews.
type Metrics struct {
	requests   *prometheus.CounterVec
	decisions  *prometheus.CounterVec
	evaluation *prometheus.HistogramVec
	errors     *prometheus.CounterVec
	// connections counts the admission port's accepted connections: each
	// costs a TLS handshake, so it should grow far slower than requests
	// while the apiserver reuses its connections.
	connections prometheus.Counter
}

// NewMetrics registers the webhook's series with reg. A nil reg keeps them
// unregistered (tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stampguard_admission_requests_total",
			Help: "Admission reviews received, by endpoint (stamp or fields).",
		}, []string{"endpoint"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stampguard_admission_decisions_total",
			Help: "Rule violations found, by policy, rule kind, action and the request's outcome (allowed or denied).",
		}, []string{"endpoint", "policy", "rule", "action", "outcome"}),
		evaluation: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stampguard_admission_evaluation_seconds",
			Help:    "Time from reading an AdmissionReview to writing the answer.",
			Buckets: []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1},
		}, []string{"endpoint"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stampguard_admission_errors_total",
			Help: "Reviews that could not be evaluated, by endpoint and reason.",
		}, []string{"endpoint", "reason"}),
		connections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stampguard_admission_connections_total",
			Help: "Connections accepted on the admission port (each pays a TLS handshake); far fewer than requests while clients keep their connections.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.decisions, m.evaluation, m.errors, m.connections)
	}
	return m
}
