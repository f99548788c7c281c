//go:build tools

// Package tools pins the Kubernetes control-plane commands that the local
// test cluster runs. It is built by ../../build.sh, never imported.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
