// Package e2e holds hiloop's end-to-end tests and benchmarks, and nothing
// else, against the real local cluster, through the shared harness of
// internal/e2e. A test starts hiloop in-process (e2e.ServeInProcess: the
// same package app that `hiloop serve` runs, with serve's flags), unless
// the serve process is what it tests: its signals and exit, what it prints
// to a person, a kill, its memory and file descriptors, and the
// benchmarks, which measure the binary as it is deployed (e2e.Serve). The
// CLI is always the built binary, run as a user runs it.
package e2e
