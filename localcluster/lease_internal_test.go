package localcluster

import (
	"net/netip"
	"os"
	"testing"
)

// TestLeasePodCIDR: clusters running at once on one machine get disjoint
// pod addresses within PodCIDRs (their helpers all bind the host's one
// loopback), a machine whose every block is leased gets an error rather
// than a block in use, and a block is free again once its lease is closed.
func TestLeasePodCIDR(t *testing.T) {
	dir := t.TempDir()
	all := netip.MustParsePrefix(PodCIDRs)
	var cidrs []string
	var leases []*os.File
	t.Cleanup(func() {
		for _, f := range leases {
			f.Close()
		}
	})
	seen := map[string]bool{}
	for i := range 1 << (24 - all.Bits()) {
		cidr, lease, err := leasePodCIDR(dir)
		if err != nil {
			t.Fatalf("lease %d: %v", i+1, err)
		}
		leases = append(leases, lease)
		p, err := netip.ParsePrefix(cidr)
		if err != nil || p.Bits() != 24 || !all.Contains(p.Addr()) {
			t.Fatalf("lease %d: %q is not a /24 of %s", i+1, cidr, PodCIDRs)
		}
		if seen[cidr] {
			t.Fatalf("lease %d: %s was already leased", i+1, cidr)
		}
		seen[cidr] = true
		cidrs = append(cidrs, cidr)
	}
	if cidr, lease, err := leasePodCIDR(dir); err == nil {
		lease.Close()
		t.Fatalf("every block is leased, yet %s was leased again", cidr)
	}
	leases[3].Close()
	cidr, lease, err := leasePodCIDR(dir)
	if err != nil {
		t.Fatalf("after a lease was closed: %v", err)
	}
	leases[3] = lease
	if cidr != cidrs[3] {
		t.Fatalf("after %s was closed, got %s", cidrs[3], cidr)
	}
}
