package sandbox_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/sandbox"
)

func TestParseReceiptRefusesUnknown(t *testing.T) {
	for _, s := range []string{"", "{", `{"v":2,"runtime_class":"gvisor"}`, `{"v":1}`, `{"v":1,"runtime_class":"gvisor","extra":1}`,
		`{"v":1,"runtime_class":"gvisor","insecure":"no-gvisor"}`, `{"v":1,"insecure":"other"}`, `{"v":1,"runtime_class":"gvisor","insecure":"other"}`} {
		if _, err := sandbox.ParseReceipt(s); err == nil {
			t.Errorf("ParseReceipt(%q) accepted", s)
		}
	}
}

// FuzzParseReceipt: no annotation value panics the receipt parser, and what
// it accepts it can write back the same.
func FuzzParseReceipt(f *testing.F) {
	for _, s := range []string{"", "{", `{"v":1,"runtime_class":"gvisor","service_account":"sa","storage":[],"transports":["exec"]}`,
		`{"v":1,"runtime_class":"gvisor","session_port":2223}`, `{"v":2}`, `null`, `[]`, `{"v":1,"insecure":"no-gvisor"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := sandbox.ParseReceipt(s)
		if err != nil {
			return
		}
		again, err := sandbox.ParseReceipt(r.Encode())
		if err != nil || !cmp.Equal(r, again) {
			t.Fatalf("receipt %q does not survive a round trip: %v", s, err)
		}
	})
}

// TestRecordReceipt: a record whose receipt is missing or unreadable is
// promised exec alone, never more.
func TestRecordReceipt(t *testing.T) {
	for _, raw := range []string{"", "{", `{"v":2,"runtime_class":"gvisor","transports":["exec","ssh","forward"]}`} {
		r := sandbox.RecordReceipt(raw)
		if len(r.Transports) != 1 || !r.Has(sandbox.TransportExec) {
			t.Errorf("RecordReceipt(%q) = %+v, want exec alone", raw, r)
		}
	}
	full := sandbox.Receipt{Version: sandbox.ReceiptVersion, RuntimeClass: "gvisor", Storage: []string{},
		Transports: []sandbox.Transport{sandbox.TransportSSH, sandbox.TransportForward}, SessionPort: 2223}
	if r := sandbox.RecordReceipt(full.Encode()); !r.Has(sandbox.TransportForward) || r.Has(sandbox.TransportExec) || r.SessionPort != 2223 {
		t.Errorf("RecordReceipt of an encoded receipt = %+v", r)
	}
}
