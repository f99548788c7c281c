//go:build tools

// Package tools pins the CNI plugins of the local cluster's real node. It is
// built by ../../build.sh, never imported.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
