package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/store"
)

// from makes one request with token (none when empty) from the client
// address addr ("192.0.2.1" is httptest's).
func (ts *testServer) from(addr, token, method, path, body string) *httptest.ResponseRecorder {
	ts.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = addr + ":40000"
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	ts.srv.ServeHTTP(rec, req)
	return rec
}

// unheld answers refusals at once: holding them paces a client, and
// would only slow these tests down.
func unheld(ts *testServer) { ts.srv.held = make(chan struct{}) }

// keyBuckets are the buckets the server holds for the key with this
// secret; nil when it holds none.
func keyBuckets(ts *testServer, secret string) *bucket {
	sum := sha256.Sum256([]byte(secret))
	ts.srv.limiters.mu.Lock()
	defer ts.srv.limiters.mu.Unlock()
	return ts.srv.limiters.keys.m[hex.EncodeToString(sum[:16])]
}

// refusedBy is the scope of a rate-limit refusal, from its message; ""
// for an answer that is not one.
func refusedBy(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if rec.Code != http.StatusTooManyRequests {
		return ""
	}
	var b api.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || b.Error.Code != api.CodeRateLimited {
		t.Fatalf("429 that is not rate_limited: %s", rec.Body.String())
	}
	switch {
	case strings.Contains(b.Error.Message, "organization"):
		return scopeOrg
	case strings.Contains(b.Error.Message, "address"):
		return scopeAddress
	default:
		return scopeKey
	}
}

// TestRandomTokensKeepRealKeysLimiter: 10,000 made-up bearer tokens, from
// one address and from a hundred, get no buckets: a real key keeps its own
// (here, one it has spent, which a fresh one would refill), nothing else
// enters the table of keys, each address is looked up only as far as its
// own burst allows, and a key that has its buckets is not slowed by the
// flood from its address.
func TestRandomTokensKeepRealKeysLimiter(t *testing.T) {
	const (
		tokens    = 10000
		addresses = 100
		addrBurst = 5
	)
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
		o.RateLimits = RateLimits{PerKey: 0.001, Burst: 3, PerAddress: 0.001, AddressBurst: addrBurst}
	})
	unheld(ts)
	ctx := context.Background()
	_, other, err := ts.db.CreateKey(ctx, ts.org.ID, "other")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if rec := ts.from("192.0.2.1", ts.token, "GET", "/v1/org", ""); rec.Code != 200 {
			t.Fatalf("request %d of a burst of 3: %d", i, rec.Code)
		}
	}
	if rec := ts.from("192.0.2.1", ts.token, "GET", "/v1/org", ""); refusedBy(t, rec) != scopeKey {
		t.Fatalf("past the key's burst: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.from("192.0.2.1", other, "GET", "/v1/org", ""); rec.Code != 200 {
		t.Fatalf("another key: %d", rec.Code)
	}
	real := keyBuckets(ts, ts.token)

	var mu sync.Mutex
	codes := map[int]int{}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for addr := range work {
				b := make([]byte, 24)
				rand.Read(b)
				rec := ts.from(addr, "hl_"+hex.EncodeToString(b), "GET", "/v1/sandboxes", "")
				mu.Lock()
				codes[rec.Code]++
				mu.Unlock()
			}
		}()
	}
	for i := range tokens {
		addr := "10.0.0.1" // half from one address, half from a hundred
		if i%2 == 1 {
			addr = fmt.Sprintf("10.1.0.%d", i%addresses)
		}
		work <- addr
	}
	close(work)
	wg.Wait()

	t.Logf("answers to %d made-up tokens: %v", tokens, codes)
	if codes[401]+codes[429] != tokens {
		t.Errorf("answers to made-up tokens: %v, want only 401 and 429", codes)
	}
	if most := (addresses/2 + 1) * addrBurst; codes[401] > most {
		t.Errorf("%d made-up tokens were looked up, want at most %d (each address's burst)", codes[401], most)
	}
	ts.srv.limiters.mu.Lock()
	nkeys, naddrs := len(ts.srv.limiters.keys.m), len(ts.srv.limiters.addrs.m)
	ts.srv.limiters.mu.Unlock()
	if nkeys != 2 || naddrs > maxLimiters {
		t.Errorf("%d key buckets (want the 2 real keys') and %d address buckets (bound %d)", nkeys, naddrs, maxLimiters)
	}
	if got := keyBuckets(ts, ts.token); got != real {
		t.Fatal("the real key's buckets were replaced")
	}
	if rec := ts.from("192.0.2.1", ts.token, "GET", "/v1/org", ""); refusedBy(t, rec) != scopeKey {
		t.Errorf("the spent key after the flood: %d %s, want still refused by its own limit", rec.Code, rec.Body.String())
	}
	if rec := ts.from("10.0.0.1", other, "GET", "/v1/org", ""); rec.Code != 200 {
		t.Errorf("a key with its buckets, from the flooded address: %d %s", rec.Code, rec.Body.String())
	}
}

// TestOrgRateLimit: an organization's keys share its buckets, so a new key
// brings no new budget; another organization is not slowed.
func TestOrgRateLimit(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
		o.RateLimits = RateLimits{PerKey: 1000, Burst: 1000, Creates: 1000, CreateBurst: 1000,
			PerOrg: 0.001, OrgBurst: 8, OrgCreates: 0.001, OrgCreateBurst: 2}
	})
	unheld(ts)
	ctx := context.Background()
	_, second, err := ts.db.CreateKey(ctx, ts.org.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	orgB, err := ts.db.CreateOrg(ctx, "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, keyB, err := ts.db.CreateKey(ctx, orgB.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	const addr = "192.0.2.1"
	for _, secret := range []string{ts.token, second} {
		if rec := ts.from(addr, secret, "POST", "/v1/sandboxes", `{"image":"busybox"}`); rec.Code != 201 {
			t.Fatalf("a create within the organization's burst: %d %s", rec.Code, rec.Body.String())
		}
	}
	if rec := ts.from(addr, ts.token, "POST", "/v1/sandboxes", `{"image":"busybox"}`); refusedBy(t, rec) != scopeOrg {
		t.Errorf("a third create, the organization's burst being 2: %d %s", rec.Code, rec.Body.String())
	}
	// 2 creates and 1 refused create took 2 of the 8 requests; 6 are left,
	// for both keys together.
	for i := range 6 {
		secret := []string{ts.token, second}[i%2]
		if rec := ts.from(addr, secret, "GET", "/v1/org", ""); rec.Code != 200 {
			t.Fatalf("request %d within the organization's burst: %d %s", i, rec.Code, rec.Body.String())
		}
	}
	for _, secret := range []string{ts.token, second} {
		if rec := ts.from(addr, secret, "GET", "/v1/org", ""); refusedBy(t, rec) != scopeOrg {
			t.Errorf("past the organization's burst: %d %s", rec.Code, rec.Body.String())
		}
	}
	// A key made now (offline: the API would refuse the create) comes with
	// buckets of its own, and none of its organization's.
	_, third, err := ts.db.CreateKey(ctx, ts.org.ID, "third")
	if err != nil {
		t.Fatal(err)
	}
	if rec := ts.from(addr, third, "GET", "/v1/org", ""); refusedBy(t, rec) != scopeOrg {
		t.Errorf("a new key of the limited organization: %d %s", rec.Code, rec.Body.String())
	}
	for i := range 7 {
		if rec := ts.from(addr, keyB, "GET", "/v1/org", ""); rec.Code != 200 {
			t.Fatalf("another organization's request %d: %d %s", i, rec.Code, rec.Body.String())
		}
	}
	if rec := ts.from(addr, keyB, "POST", "/v1/sandboxes", `{"image":"busybox"}`); rec.Code != 201 {
		t.Errorf("another organization's create: %d %s", rec.Code, rec.Body.String())
	}
}

// TestAddressLimit: requests without a valid key, and the routes that need
// none but the kubelet's probes, are limited per client address; another
// address is not, and a key that has authenticated is not held to its
// address's limit. A revoked key loses its buckets and is held to its
// address's from then on.
func TestAddressLimit(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
		o.RateLimits = RateLimits{PerAddress: 0.001, AddressBurst: 3}
	})
	unheld(ts)
	ctx := context.Background()
	k, second, err := ts.db.CreateKey(ctx, ts.org.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	if rec := ts.from("192.0.2.9", second, "GET", "/v1/org", ""); rec.Code != 200 {
		t.Fatalf("a key's first request: %d", rec.Code)
	}
	const addr = "192.0.2.1"
	if rec := ts.from(addr, "", "GET", "/v1/openapi.json", ""); rec.Code != 200 {
		t.Fatalf("the OpenAPI document within the address's burst: %d", rec.Code)
	}
	for range 2 {
		if rec := ts.from(addr, "", "GET", "/v1/org", ""); rec.Code != 401 {
			t.Fatalf("no token within the address's burst: %d", rec.Code)
		}
	}
	for _, tc := range []struct{ token, path string }{{"", "/v1/openapi.json"}, {"", "/v1/org"}, {"hl_madeup", "/v1/org"}} {
		if rec := ts.from(addr, tc.token, "GET", tc.path, ""); refusedBy(t, rec) != scopeAddress {
			t.Errorf("GET %s with token %q past the address's burst: %d %s", tc.path, tc.token, rec.Code, rec.Body.String())
		}
	}
	// The kubelet's probes are never held to an address's limit: behind a
	// NAT it shares its address with anyone.
	for range 10 {
		for _, path := range []string{"/healthz", "/readyz"} {
			if rec := ts.from(addr, "", "GET", path, ""); rec.Code != 200 {
				t.Fatalf("GET %s from the spent address: %d %s", path, rec.Code, rec.Body.String())
			}
		}
	}
	huge := "hl_" + strings.Repeat("x", 1<<20)
	if rec := ts.from("192.0.2.4", huge, "GET", "/v1/org", ""); rec.Code != 401 || keyBuckets(ts, huge) != nil {
		t.Errorf("a token of a megabyte: %d, want 401 and no buckets", rec.Code)
	}
	if rec := ts.from("192.0.2.2", "", "GET", "/v1/openapi.json", ""); rec.Code != 200 {
		t.Errorf("another address: %d", rec.Code)
	}
	for i := range 5 {
		if rec := ts.from(addr, second, "GET", "/v1/org", ""); rec.Code != 200 {
			t.Fatalf("a key with its buckets from the spent address, request %d: %d %s", i, rec.Code, rec.Body.String())
		}
	}
	if err := ts.db.RevokeKey(ctx, ts.org.ID, k.ID, false); err != nil {
		t.Fatal(err)
	}
	if rec := ts.from("192.0.2.3", second, "GET", "/v1/org", ""); rec.Code != 401 {
		t.Fatalf("a revoked key: %d", rec.Code)
	}
	if keyBuckets(ts, second) != nil {
		t.Error("a revoked key kept its buckets")
	}
	if rec := ts.from(addr, second, "GET", "/v1/org", ""); refusedBy(t, rec) != scopeAddress {
		t.Errorf("a revoked key from the spent address: %d %s", rec.Code, rec.Body.String())
	}
}

// TestKeyLimit: an organization has at most APIKeysPerOrg live API keys and
// SSHKeysPerOrg SSH keys; one more is 409 key_limit, a revoked or deleted
// key frees its place, and another organization is not affected.
func TestKeyLimit(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Limits.APIKeysPerOrg, co.Limits.SSHKeysPerOrg = 3, 2
	})
	ctx := context.Background()
	orgB, err := ts.db.CreateOrg(ctx, "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, secretB, err := ts.db.CreateKey(ctx, orgB.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	b := *ts
	b.token = secretB

	// The bootstrap key is the first of 3.
	var made []api.CreatedKey
	for range 2 {
		rec := ts.do("POST", "/v1/keys", `{"name":"k"}`)
		if rec.Code != 201 {
			t.Fatalf("a key within the limit: %d %s", rec.Code, rec.Body.String())
		}
		var ck api.CreatedKey
		json.Unmarshal(rec.Body.Bytes(), &ck)
		made = append(made, ck)
	}
	rec := ts.do("POST", "/v1/keys", `{"name":"one too many"}`)
	if rec.Code != 409 || errCode(t, rec) != api.CodeKeyLimit || !strings.Contains(rec.Body.String(), "3 live API keys") {
		t.Fatalf("a key past the limit: %d %s", rec.Code, rec.Body.String())
	}
	// The key past the limit was not written.
	if keys, _ := ts.db.Keys(ctx, ts.org.ID); len(keys) != 3 {
		t.Errorf("%d keys recorded, want 3", len(keys))
	}
	for range 2 {
		if rec := b.do("POST", "/v1/keys", `{"name":"b"}`); rec.Code != 201 {
			t.Fatalf("another organization's key: %d %s", rec.Code, rec.Body.String())
		}
	}
	if rec := ts.do("DELETE", "/v1/keys/"+made[0].ID, ""); rec.Code != 204 {
		t.Fatalf("revoke: %d", rec.Code)
	}
	if rec := ts.do("POST", "/v1/keys", `{"name":"after a revoke"}`); rec.Code != 201 {
		t.Errorf("a key after a revoke freed a place: %d %s", rec.Code, rec.Body.String())
	}

	var sshIDs []string
	for range 2 {
		rec := ts.do("POST", "/v1/ssh-keys", sshKeyBody(t))
		if rec.Code != 201 {
			t.Fatalf("an SSH key within the limit: %d %s", rec.Code, rec.Body.String())
		}
		var k store.SSHKey
		json.Unmarshal(rec.Body.Bytes(), &k)
		sshIDs = append(sshIDs, k.ID)
	}
	if rec := ts.do("POST", "/v1/ssh-keys", sshKeyBody(t)); rec.Code != 409 || errCode(t, rec) != api.CodeKeyLimit {
		t.Fatalf("an SSH key past the limit: %d %s", rec.Code, rec.Body.String())
	}
	if rec := b.do("POST", "/v1/ssh-keys", sshKeyBody(t)); rec.Code != 201 {
		t.Errorf("another organization's SSH key: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("DELETE", "/v1/ssh-keys/"+sshIDs[0], ""); rec.Code != 204 {
		t.Fatalf("delete: %d", rec.Code)
	}
	if rec := ts.do("POST", "/v1/ssh-keys", sshKeyBody(t)); rec.Code != 201 {
		t.Errorf("an SSH key after a delete freed a place: %d %s", rec.Code, rec.Body.String())
	}
}

// TestReadyzOneCheckAtATime: /readyz is open to anyone and held to no
// address limit, so what bounds it is that concurrent requests share one
// readiness check: a flood while the check hangs starts no second one, and
// every request still answers within ReadyTimeout.
func TestReadyzOneCheckAtATime(t *testing.T) {
	var checks atomic.Int32
	release := make(chan struct{})
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
		o.ReadyTimeout = 200 * time.Millisecond
		o.Ready = func(ctx context.Context) error {
			checks.Add(1)
			<-release // hangs, ignoring ctx, as a hung API server's call can
			return nil
		}
	})
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rec := ts.from("192.0.2.1", "", "GET", "/readyz", ""); rec.Code != 503 || errCode(t, rec) != api.CodeNotReady {
				t.Errorf("readyz while the check hangs: %d %s", rec.Code, rec.Body.String())
			}
		}()
	}
	wg.Wait()
	if n := checks.Load(); n != 1 {
		t.Errorf("%d readiness checks for 100 concurrent requests, want 1", n)
	}
	close(release)
	eventually.True(t, "a new check once the hung one ended", func() bool {
		return ts.from("192.0.2.1", "", "GET", "/readyz", "").Code == 200
	})
	before := checks.Load()
	if rec := ts.from("192.0.2.1", "", "GET", "/readyz", ""); rec.Code != 200 {
		t.Fatalf("readyz: %d", rec.Code)
	}
	if n := checks.Load(); n != before+1 {
		t.Errorf("a request with no check in flight ran %d checks, want its own", n-before)
	}
}
