// Package layers holds the test of hiloop's layout: calls run downward.
// The ways in (server, sshd) call the core (control); the core calls the
// record (store) and speaks to the cluster in the shared vocabulary of
// package cluster, which the cluster adapter (k8s) implements, so neither
// the core nor a way in links Kubernetes; the mirror calls the record and
// the adapter, and so does the isolation self-check (boundary). The shared
// vocabulary (api, cluster, receipt, forward) calls nothing of hiloop's.
// Only app wires the parts together (for main, and for the end-to-end
// harness's in-process hiloop). The test holds
// every package to exactly the imports its map names.
package layers
