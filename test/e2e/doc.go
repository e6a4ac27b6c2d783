// Package e2e holds end-to-end tests that run stampguard against a real
// kube-apiserver and etcd (test/kubetest) and a real ClickHouse
// (test/chtest).
package e2e
