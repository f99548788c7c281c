package receipt_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/receipt"
)

func TestParseReceiptRefusesUnknown(t *testing.T) {
	for _, s := range []string{"", "{", `{"v":2,"runtime_class":"gvisor"}`, `{"v":1}`, `{"v":1,"runtime_class":"gvisor","extra":1}`,
		`{"v":1,"runtime_class":"gvisor","insecure":"no-gvisor"}`, `{"v":1,"insecure":"other"}`, `{"v":1,"runtime_class":"gvisor","insecure":"other"}`} {
		if _, err := receipt.Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
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
		r, err := receipt.Parse(s)
		if err != nil {
			return
		}
		again, err := receipt.Parse(r.Encode())
		if err != nil || !cmp.Equal(r, again) {
			t.Fatalf("receipt %q does not survive a round trip: %v", s, err)
		}
	})
}

// TestRecordReceipt: a record whose receipt is missing or unreadable is
// promised exec alone, never more.
func TestRecordReceipt(t *testing.T) {
	for _, raw := range []string{"", "{", `{"v":2,"runtime_class":"gvisor","transports":["exec","ssh","forward"]}`} {
		r := receipt.Record(raw)
		if len(r.Transports) != 1 || !r.Has(receipt.TransportExec) {
			t.Errorf("Record(%q) = %+v, want exec alone", raw, r)
		}
	}
	full := receipt.Receipt{Version: receipt.Version, RuntimeClass: "gvisor", Storage: []string{},
		Transports: []receipt.Transport{receipt.TransportSSH, receipt.TransportForward}, SessionPort: 2223}
	if r := receipt.Record(full.Encode()); !r.Has(receipt.TransportForward) || r.Has(receipt.TransportExec) || r.SessionPort != 2223 {
		t.Errorf("Record of an encoded receipt = %+v", r)
	}
}
