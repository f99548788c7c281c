//go:build tools

// Package tools pins the upstream agent-sandbox controller.
package tools

import _ "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
