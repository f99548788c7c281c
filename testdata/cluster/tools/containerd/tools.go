//go:build tools

// Package tools pins containerd and its runc shim, the local cluster's real
// node's container runtime. It is built by ../../build.sh, never imported.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
