// Package webhookconfig is the MutatingWebhookConfiguration and
// ValidatingWebhookConfiguration that route guarded writes to the
// webhook: built from ConfigOptions and narrowed to what the policies
// need (the pre-filter), kept in step with the live policies on the
// apiserver (Syncer), and written into the chart (chartgen, by go
// generate).
package webhookconfig
