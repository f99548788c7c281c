package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
		_, serr := c.Exec(context.Background(), "sbx_x", ExecOptions{Command: []string{"true"}})
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

// TestCreateRetriesWithOneKey: a create refused with 503 or 429 and a
// Retry-After is tried again after the wait, every try with the same
// Idempotency-Key; a 429 without Retry-After (a quota) is not retried, and
// the error carries the code and the request id.
func TestCreateRetriesWithOneKey(t *testing.T) {
	var keys []string
	answers := []int{503, 429, 201}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		status := answers[len(keys)-1]
		w.Header().Set("X-Request-Id", fmt.Sprint("req_", len(keys)))
		if status != 201 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(status)
			fmt.Fprint(w, `{"error":{"code":"storage_unavailable","message":"try again"}}`)
			return
		}
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id":"sbx_1","state":"pending"}`)
	}))
	defer srv.Close()
	c := NewClient(srv.URL, "hl_x")
	sb, err := c.CreateSandbox(context.Background(), CreateSandboxRequest{Image: "busybox"}, "")
	if err != nil || sb.ID != "sbx_1" {
		t.Fatalf("create: %v %+v", err, sb)
	}
	if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Errorf("Idempotency-Keys of the tries: %q, want one key three times", keys)
	}

	quota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, "")
		w.Header().Set("X-Request-Id", "req_q")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"code":"quota_exceeded","message":"quota"}}`)
	}))
	defer quota.Close()
	keys = nil
	_, err = NewClient(quota.URL, "hl_x").CreateSandbox(context.Background(), CreateSandboxRequest{Image: "busybox"}, "k")
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeQuotaExceeded || e.Status != 429 || e.RequestID != "req_q" || len(keys) != 1 {
		t.Errorf("quota: %v (%d tries), want one try refused quota_exceeded with its request id", err, len(keys))
	}
}

// TestErrorPrintable: a server's answer reaches a terminal without
// control characters, whichever of its fields carries them: the message,
// the code or the request's id.
func TestErrorPrintable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprint(w, `{"error":{"code":"x\u001b[2J\u009b","message":"m\u001b]0;owned\u0007","request_id":"r\u001b[31m\u0085"}}`)
	}))
	defer srv.Close()
	c := &Client{URL: srv.URL, Token: "hl_test"}
	_, err := c.ReadFile(context.Background(), "sbx_x", "/f")
	if err == nil {
		t.Fatal("no error")
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\u001b\u009b\u0007\u0085") || !strings.Contains(msg, "m]0;owned (x[2J) [request r[31m]") {
		t.Errorf("error %q", msg)
	}
}

// TestCreatePreviewTriedOnce: a preview's create is not retried, even on
// an answer that invites a retry (a second try would make a second
// preview, with a second token); its body is the request.
func TestCreatePreviewTriedOnce(t *testing.T) {
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies = append(bodies, r.Method+" "+r.URL.Path+" "+string(body))
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(503)
		fmt.Fprint(w, `{"error":{"code":"storage_unavailable","message":"try again"}}`)
	}))
	defer srv.Close()
	_, err := NewClient(srv.URL, "hl_x").CreatePreview(context.Background(), "sbx_1", CreatePreviewRequest{Port: 3000, Auth: PreviewAuthKey, TTL: "1h"})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeStorageUnavailable {
		t.Fatalf("create preview: %v", err)
	}
	want := `POST /v1/sandboxes/sbx_1/previews {"port":3000,"auth":"key","ttl":"1h"}`
	if len(bodies) != 1 || strings.TrimSpace(bodies[0]) != want {
		t.Errorf("requests %q, want one: %s", bodies, want)
	}
}
