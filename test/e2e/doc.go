// Package e2e holds end-to-end tests that run stampguard against a real
// kube-apiserver and etcd (internal/kubetest) and a real ClickHouse
// (internal/chtest).
package e2e
