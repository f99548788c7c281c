package e2e_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
)

// TestAttackProcesses: what a stranger, a revoked key or a racing caller
// sends to the background processes API is refused with its code, never
// a server error: malformed offsets and signals are 400, ids that are not
// a process of that sandbox (path traversal, a very long id, a process of
// another sandbox of the same organization) are 404, a revoked key is
// 401 everywhere, and 33 starts at once leave exactly 32 running with the
// rest 429 process_limit. No answer names a pod, node or service account.
func TestAttackProcesses(t *testing.T) {
	// Session limits past the race, so only the process limit refuses.
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--exec-per-sandbox", "64", "--exec-per-org", "128")
	sb := in.Create(in.Token, "busybox", "--wait")
	sb2 := in.Create(in.Token, "busybox", "--wait")
	reapProcesses(t, in, in.Token, sb.ID)
	reapProcesses(t, in, in.Token, sb2.ID)
	base := "/v1/sandboxes/" + sb.ID + "/processes"
	p := startProc(t, in, in.Token, sb.ID, "sleep", "300")
	q := startProc(t, in, in.Token, sb2.ID, "sleep", "300")
	pp := base + "/" + p.ID

	leaks := func(body string) bool {
		for _, w := range []string{"pod", "node", "serviceaccount", "service account", "kube"} {
			if strings.Contains(strings.ToLower(body), w) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", pp + "/output?offset=abc", "", 400, api.CodeInvalidField},
		{"GET", pp + "/output?offset=99999999999999999999", "", 400, api.CodeInvalidField},
		{"GET", pp + "/output?offset=1.5", "", 400, api.CodeInvalidField},
		{"GET", pp + "/output?offset=0x10", "", 400, api.CodeInvalidField},
		{"GET", pp + "/output?offset=-9223372036854775808", "", 400, api.CodeInvalidField},
		{"GET", pp + "/output?offset=1&offset=2&nope=1", "", 400, api.CodeUnknownField},
		{"POST", pp + "/signal", `{"signal":"term"}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":"SIGTERM"}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":"9"}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":""}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":"TERM; kill -9 -1"}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":"` + strings.Repeat("K", 1000) + `"}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":"` + strings.Repeat("K", 100000) + `"}`, 413, api.CodeBodyTooLarge},
		{"POST", pp + "/signal", `{}`, 400, api.CodeInvalidField},
		{"POST", pp + "/signal", `{"signal":9}`, 400, api.CodeInvalidField},
		{"POST", pp + "/stdin?close=maybe", "x", 400, api.CodeInvalidField},
		{"GET", base + "/..%2F..%2Fetc%2Fpasswd", "", 404, api.CodeNotFound},
		{"GET", base + "/..%2F" + p.ID + "/output", "", 404, api.CodeNotFound},
		{"POST", base + "/%2E%2E/signal", `{"signal":"KILL"}`, 404, api.CodeNotFound},
		{"DELETE", base + "/" + strings.Repeat("p", 4000), "", 404, api.CodeNotFound},
		{"GET", base + "/" + q.ID, "", 404, api.CodeNotFound},
		{"GET", base + "/" + q.ID + "/output", "", 404, api.CodeNotFound},
		{"POST", base + "/" + q.ID + "/stdin", "x", 404, api.CodeNotFound},
		{"POST", base + "/" + q.ID + "/signal", `{"signal":"KILL"}`, 404, api.CodeNotFound},
		{"DELETE", base + "/" + q.ID, "", 404, api.CodeNotFound},
	} {
		status, body := in.Call(in.Token, c.method, c.path, c.body)
		if status != c.status || errorCode(t, body) != c.code || leaks(body) {
			t.Errorf("%s %.80s %.40q: %d %.300s; want %d %s", c.method, c.path, c.body, status, body, c.status, c.code)
		}
	}
	if got := getProc(t, in, in.Token, sb2.ID, q.ID); got.State != api.ProcessRunning {
		t.Errorf("the process another sandbox's path named: %+v", got)
	}

	t.Run("a revoked key", func(t *testing.T) {
		status, body := in.Call(in.Token, "POST", "/v1/keys", `{"name":"doomed"}`)
		var k api.CreatedKey
		if status != 201 || json.Unmarshal([]byte(body), &k) != nil {
			t.Fatalf("create key: %d %s", status, body)
		}
		if status, body := in.Call(in.Token, "DELETE", "/v1/keys/"+k.ID, ""); status/100 != 2 {
			t.Fatalf("revoke: %d %s", status, body)
		}
		for _, c := range []struct{ method, path, body string }{
			{"POST", base, `{"command":["true"]}`}, {"GET", base, ""}, {"GET", pp, ""}, {"DELETE", pp, ""},
			{"GET", pp + "/output", ""}, {"POST", pp + "/stdin", "x"}, {"POST", pp + "/signal", `{"signal":"KILL"}`}} {
			if status, body := in.Call(k.Secret, c.method, c.path, c.body); status != 401 || errorCode(t, body) != api.CodeUnauthorized {
				t.Errorf("%s %s with a revoked key: %d %s", c.method, c.path, status, body)
			}
		}
		if got := getProc(t, in, in.Token, sb.ID, p.ID); got.State != api.ProcessRunning {
			t.Errorf("after the revoked key's calls: %+v", got)
		}
	})

	t.Run("33 starts at once", func(t *testing.T) {
		status, body := in.Call(in.Token, "GET", base, "")
		var l api.ProcessList
		if status != 200 || json.Unmarshal([]byte(body), &l) != nil {
			t.Fatalf("list: %d %s", status, body)
		}
		running := 0
		for _, x := range l.Items {
			if x.State == api.ProcessRunning {
				running++
			}
		}
		n := 33 - running
		var mu sync.Mutex
		answers := map[int]int{}
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				status, body := in.Call(in.Token, "POST", base, `{"command":["sleep","300"]}`)
				if status == 429 && errorCode(t, body) != api.CodeProcessLimit {
					t.Errorf("429 %s", body)
				}
				mu.Lock()
				answers[status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if answers[http.StatusCreated] != n-1 || answers[http.StatusTooManyRequests] != 1 || len(answers) != 2 {
			t.Fatalf("%d starts with %d running: %v; want %d created and one 429", n, running, answers, n-1)
		}
		status, body = in.Call(in.Token, "GET", base, "")
		json.Unmarshal([]byte(body), &l)
		running = 0
		for _, x := range l.Items {
			if x.State == api.ProcessRunning {
				running++
			}
		}
		if running != 32 {
			t.Fatalf("%d running after the race; want 32", running)
		}
	})
}
