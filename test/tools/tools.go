//go:build tools

// Package tools pins the control-plane binaries that the end-to-end tests
// run: kube-apiserver and etcd, built from the Go module proxy.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
