// Package e2e holds hiloop's end-to-end tests and benchmarks, and nothing
// else: the built hiloop binary, run as a user runs it, against the real
// local cluster, through the shared harness of internal/e2e.
package e2e
