package control

import (
	"math/big"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// TestQuantityAsKubernetesReadsIt: the core reads a quantity as the API
// server will (apimachinery's parser, which only the test links): the
// same strings are quantities, with the same values; but an exponent past
// maxExponent, far above any bound, the core refuses as no quantity.
func TestQuantityAsKubernetesReadsIt(t *testing.T) {
	for _, s := range []string{
		"0", "1", "500m", "0.5", ".5", "1.", "+2", "-1", "2.5Gi", "512Mi", "1Ki", "1Ei", "3E", "1e3", "1E3", "1e-3", "1.5e+2",
		"100n", "100u", "7k", "1M", "1G", "1T", "1P", "0.000001", "123456789012", "1.25Ki",
		"", " 1", "1 ", "1KI", "1ki", "1K", "1b", "Mi", "m", ".", "1..2", "1.2.3", "--1", "1e", "1e+", "0x10", "1_000", "１", "1Gi ", "e3", "1mi", "+", "-", "+Mi", "-.", "+.5", "-.5k", "1.e3", ".e3", "00012", "1.50", "+1e-9", "1e64",
	} {
		want, werr := resource.ParseQuantity(s)
		got, gerr := parseQuantity(s)
		if (werr == nil) != (gerr == nil) {
			t.Errorf("%q: Kubernetes %v, the core %v", s, werr, gerr)
			continue
		}
		if werr != nil {
			continue
		}
		if k := new(big.Rat).SetFrac(want.AsDec().UnscaledBig(), big.NewInt(1)); true {
			scale := want.AsDec().Scale()
			if scale > 0 {
				k.Quo(k, pow(10, int64(scale)))
			} else if scale < 0 {
				k.Mul(k, pow(10, int64(-scale)))
			}
			if k.Cmp(got) != 0 {
				t.Errorf("%q: Kubernetes %s, the core %s", s, k.RatString(), got.RatString())
			}
		}
	}
	if _, err := parseQuantity("1e65"); err == nil {
		t.Error("1e65 is a quantity to the core")
	}
}
