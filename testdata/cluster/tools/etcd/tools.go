//go:build tools

// Package tools pins the etcd server that the local test cluster runs.
package tools

import _ "go.etcd.io/etcd/server/v3"
