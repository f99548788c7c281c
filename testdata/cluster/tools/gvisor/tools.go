//go:build tools

// Package tools pins gVisor's runsc and its containerd shim, which the local
// cluster's real node runs sandboxes with. It is built by ../../build.sh,
// never imported.
package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
