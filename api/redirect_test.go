package api

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestClientFollowsNoRedirect: the API never redirects, and Go's HTTP
// client forwards the Authorization header on a redirect to the same host
// whatever the scheme, and to its subdomains. So a front (a proxy, an
// ingress) that answered https://hiloop.example.com with a redirect to
// http:// would have the key sent in clear text, past the refusal of plain
// http: the client refuses every redirect instead, and says so.
func TestClientFollowsNoRedirect(t *testing.T) {
	var keys atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			keys.Add(1)
		}
		writeJSONTest(w, `{"id":"org_x","name":"x"}`)
	}))
	defer plain.Close()
	_, plainPort, _ := net.SplitHostPort(strings.TrimPrefix(plain.URL, "http://"))
	for _, target := range []string{"http://example.com:" + plainPort, "http://api.example.com:" + plainPort} {
		front := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target+r.URL.Path, http.StatusTemporaryRedirect)
		}))
		// example.com and its subdomains are served here: the plain server
		// on its port, the TLS front on every other.
		tr := front.Client().Transport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: tr.TLSClientConfig.RootCAs, ServerName: "example.com"}
		frontAddr := strings.TrimPrefix(front.URL, "https://")
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if _, port, _ := net.SplitHostPort(addr); port == plainPort {
				return (&net.Dialer{}).DialContext(ctx, network, "127.0.0.1:"+plainPort)
			}
			return (&net.Dialer{}).DialContext(ctx, network, frontAddr)
		}
		_, frontPort, _ := net.SplitHostPort(frontAddr)
		c := &Client{URL: "https://example.com:" + frontPort, Token: "hl_secret", HTTP: &http.Client{Transport: tr}}
		_, err := c.Org(context.Background())
		if err == nil || !strings.Contains(err.Error(), "redirect") {
			t.Errorf("a redirect to %s: %v, want refused naming the redirect", target, err)
		}
		front.Close()
	}
	if n := keys.Load(); n > 0 {
		t.Errorf("the key reached the plain http server %d times", n)
	}
}

func writeJSONTest(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(body))
}
