package control

import (
	"errors"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// quantityForm is the grammar of a Kubernetes resource quantity: a signed
// decimal number (of no digits at all, 0, as the API server reads it), then a binary suffix (Ki to Ei), a decimal one (n to E)
// or a decimal exponent (e3, E-2). The cluster reads the same string the
// caller sent; the core only needs its value, to hold it to the bounds.
var quantityForm = regexp.MustCompile(`^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]*)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$`)

// suffixes are the multipliers of the named suffixes.
var suffixes = map[string]*big.Rat{
	"n": big.NewRat(1, 1e9), "u": big.NewRat(1, 1e6), "m": big.NewRat(1, 1e3), "": big.NewRat(1, 1),
	"k": pow(10, 3), "M": pow(10, 6), "G": pow(10, 9), "T": pow(10, 12), "P": pow(10, 15), "E": pow(10, 18),
	"Ki": pow(2, 10), "Mi": pow(2, 20), "Gi": pow(2, 30), "Ti": pow(2, 40), "Pi": pow(2, 50), "Ei": pow(2, 60),
}

func pow(base, exp int64) *big.Rat {
	return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil))
}

// maxExponent bounds a decimal exponent: no quantity a deployment bounds
// is near it, and a huge one would cost a huge number to compute.
const maxExponent = 64

var errNotQuantity = errors.New("not a quantity")

// parseQuantity is the exact value of the quantity s.
func parseQuantity(s string) (*big.Rat, error) {
	m := quantityForm.FindStringSubmatch(s)
	if s == "" || m == nil {
		return nil, errNotQuantity
	}
	v := new(big.Rat) // a number of no digits, as in "Mi" or ".", is 0
	if strings.ContainsAny(m[1], "0123456789") {
		if _, ok := v.SetString(strings.TrimSuffix(m[1], ".")); !ok {
			return nil, errNotQuantity
		}
	}
	if mul, ok := suffixes[m[2]]; ok {
		return v.Mul(v, mul), nil
	}
	exp, err := strconv.Atoi(m[2][1:])
	if err != nil || exp > maxExponent || exp < -maxExponent {
		return nil, errNotQuantity
	}
	if exp < 0 {
		return v.Quo(v, pow(10, int64(-exp))), nil
	}
	return v.Mul(v, pow(10, int64(exp))), nil
}

// mustQuantity is parseQuantity of a bound the code itself names.
func mustQuantity(s string) *big.Rat {
	q, err := parseQuantity(s)
	if err != nil {
		panic("control: bad quantity " + strconv.Quote(s))
	}
	return q
}
