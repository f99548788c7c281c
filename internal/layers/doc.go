// Package layers holds the test of hiloop's layout: calls run downward.
// The ways in (server, sshd) and the mirror call the core (control), the
// core calls the record (store) and the cluster adapter (k8s), and the
// shared vocabulary (api, sandbox, forward) calls nothing of hiloop's. Only
// main wires the parts together.
package layers
