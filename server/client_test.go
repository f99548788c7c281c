package server

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

// TestClientRefusesPlainHTTP: the client sends its key over plain http://
// only to a loopback host, unless told InsecureHTTP. A refused URL is
// refused before anything is dialled; an allowed one is dialled (port 1
// refuses the connection).
func TestClientRefusesPlainHTTP(t *testing.T) {
	for _, tc := range []struct {
		url      string
		insecure bool
		refused  bool
	}{
		{"http://127.0.0.1:1", false, false},
		{"http://127.3.2.1:1", false, false},
		{"http://[::1]:1", false, false},
		{"http://localhost:1", false, false},
		{"http://LocalHost:1/", false, false},
		{"http://10.1.2.3:1", false, true},
		{"http://[::ffff:10.1.2.3]:1", false, true},
		{"http://0.0.0.0:1", false, true},
		{"http://hiloop.invalid:1", false, true},
		{"http://localhost.hiloop.invalid:1", false, true},
		{"http://127.0.0.1.hiloop.invalid:1", false, true},
		{"http://hiloop.invalid:1", true, false},
		{"ftp://127.0.0.1:1", false, true},
		{"127.0.0.1:1", false, true},
	} {
		c := &Client{URL: tc.url, Token: "hl_secret", InsecureHTTP: tc.insecure}
		_, err := c.Org(context.Background())
		_, serr := c.ExecStream(context.Background(), "sbx_x", StreamOptions{Command: []string{"true"}})
		for _, err := range []error{err, serr} {
			var op *net.OpError
			var dns *net.DNSError
			dialled := errors.As(err, &op) || errors.As(err, &dns)
			if tc.refused && (dialled || err == nil) {
				t.Errorf("%s (insecure %v): %v, want refused before dialling", tc.url, tc.insecure, err)
			}
			if !tc.refused && !dialled {
				t.Errorf("%s (insecure %v): %v, want it dialled", tc.url, tc.insecure, err)
			}
		}
	}
	_, err := (&Client{URL: "http://10.1.2.3:1"}).Org(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--insecure-http") {
		t.Fatalf("the refusal does not say how to override it: %v", err)
	}
}
