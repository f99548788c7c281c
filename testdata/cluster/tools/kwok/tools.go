//go:build tools

// Package tools pins kwok and kwokctl, which fake the local cluster's nodes
// and pods.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
