// Package receipt holds the runtime receipt, the promise the control plane
// makes for one sandbox and the mirror holds its pod to, and what it is
// made of: the transports a sandbox can be reached by and, beside it, the
// runtime its pod was seen to run. It imports nothing of hiloop's, so the
// store, the cluster adapter, the core and the ways in can all speak it.
package receipt

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Transport is a way into a sandbox. A deployment backs a set of them, and a
// sandbox asks for a subset at create time and gets it in its receipt.
type Transport string

const (
	// TransportExec is the API's exec (one-shot and streaming).
	TransportExec Transport = "exec"
	// TransportSSH is shells and commands through the SSH gateway; it needs
	// nothing extra in the pod.
	TransportSSH Transport = "ssh"
	// TransportForward is ssh -L, through the session helper container.
	TransportForward Transport = "forward"
)

// Transports lists every transport hiloop can back, in a fixed order.
func Transports() []Transport {
	return []Transport{TransportExec, TransportSSH, TransportForward}
}

// Known reports whether t is a transport hiloop can back.
func (t Transport) Known() bool { return slices.Contains(Transports(), t) }

// Receipt is what the control plane promised for one sandbox. It is stored
// in the record at create time and written as a pod-template annotation, so
// the mirror can hold the live pod to it.
type Receipt struct {
	Version        int         `json:"v"`
	RuntimeClass   string      `json:"runtime_class"`
	ServiceAccount string      `json:"service_account"`
	Storage        []string    `json:"storage"`
	Transports     []Transport `json:"transports"`
	// SessionPort is the session helper's port, set only for sandboxes
	// that have the helper (transport forward).
	SessionPort int `json:"session_port,omitempty"`
	// Insecure is InsecureNoGVisor for a sandbox made by a development
	// deployment without gVisor; RuntimeClass is then empty.
	Insecure string `json:"insecure,omitempty"`
}

// InsecureNoGVisor marks a receipt of a sandbox that runs without gVisor
// (serve --insecure-no-gvisor, for clusters like kind).
const InsecureNoGVisor = "no-gvisor"

// Version is the receipt format this binary writes and reads.
const Version = 1

// Isolation says how the sandbox is isolated, as the API shows it: the
// runtime class, or "insecure-no-gvisor".
func (r Receipt) Isolation() string {
	if r.Insecure == InsecureNoGVisor {
		return "insecure-" + InsecureNoGVisor
	}
	return r.RuntimeClass
}

// Has reports whether the receipt promises transport t.
func (r Receipt) Has(t Transport) bool { return slices.Contains(r.Transports, t) }

// Encode is the receipt as stored and annotated.
func (r Receipt) Encode() string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a struct of strings and ints always marshals
	}
	return string(b)
}

// Parse reads a receipt, refusing anything it does not fully
// understand.
func Parse(s string) (Receipt, error) {
	var r Receipt
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Receipt{}, fmt.Errorf("receipt: %w", err)
	}
	if r.Version != Version || (r.RuntimeClass == "") != (r.Insecure == InsecureNoGVisor) ||
		(r.Insecure != "" && r.Insecure != InsecureNoGVisor) {
		return Receipt{}, fmt.Errorf("receipt: version %d, runtime class %q, insecure %q", r.Version, r.RuntimeClass, r.Insecure)
	}
	return r, nil
}

// Record is the promise a record holds, for deciding what may reach
// into it. A record older than stored receipts, or one whose receipt does
// not parse, was made when exec was the only transport, and is promised
// exactly that: never more.
func Record(raw string) Receipt {
	r, err := Parse(raw)
	if err != nil {
		return Receipt{Transports: []Transport{TransportExec}}
	}
	return r
}
