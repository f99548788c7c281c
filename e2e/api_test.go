package e2e_test

import (
	"github.com/hiloop/hiloop/internal/e2e"

	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
)

// tryCreate posts a create that a test expects to be refused sooner or
// later, and deletes the sandbox when it was created after all, so that
// retrying does not use up the organization's quota.
func tryCreate(t *testing.T, in *e2e.Instance) (int, string) {
	t.Helper()
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if status == http.StatusCreated {
		var sb struct{ ID string }
		json.Unmarshal([]byte(body), &sb)
		if s, b := in.Call(in.Token, "DELETE", "/v1/sandboxes/"+sb.ID, ""); s != http.StatusOK {
			t.Fatalf("delete %s: %d %s", sb.ID, s, b)
		}
	}
	return status, body
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message, Field string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("not the error envelope: %q", body)
	}
	return e.Error.Code
}

// TestOrgIsolation: a key of org A can never see, change or learn of org
// B's sandboxes, and the answer is byte-for-byte the one for an absent id.
func TestOrgIsolation(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	a := in.NewOrg("org-a", 10, 10)
	b := in.NewOrg("org-b", 10, 10)
	sa := in.Create(a, "busybox", "--label", "team=x")
	sb := in.Create(b, "busybox", "--label", "team=x")
	absent := "sbx_aaaaaaaaaaaaaaaa"

	for _, tc := range []struct{ key, foreign, own string }{{a, sb.ID, sa.ID}, {b, sa.ID, sb.ID}} {
		for _, req := range []struct{ method, path, body string }{
			{"GET", "/v1/sandboxes/%s", ""},
			{"GET", "/v1/sandboxes/%s/events", ""},
			{"POST", "/v1/sandboxes/%s/stop", ""},
			{"POST", "/v1/sandboxes/%s/start", ""},
			{"PATCH", "/v1/sandboxes/%s", `{"ttl":"1h"}`},
			{"DELETE", "/v1/sandboxes/%s", ""},
		} {
			fs, fbody := in.Call(tc.key, req.method, fmt.Sprintf(req.path, tc.foreign), req.body)
			as, abody := in.Call(tc.key, req.method, fmt.Sprintf(req.path, absent), req.body)
			if fs != 404 || fs != as || e2e.WithoutRequestID(fbody) != e2e.WithoutRequestID(abody) {
				t.Errorf("%s %s on a foreign sandbox: %d %q; on an absent one: %d %q", req.method, req.path, fs, fbody, as, abody)
			}
		}
		status, body := in.Call(tc.key, "GET", "/v1/sandboxes?label=team=x", "")
		if status != 200 || strings.Contains(body, tc.foreign) || !strings.Contains(body, tc.own) {
			t.Errorf("list shows %d %s", status, body)
		}
		// The CLI reports the same not-found.
		if _, errOut, code := in.CLI(tc.key, "sandbox", "get", tc.foreign); code == 0 || !strings.Contains(errOut, "not_found") {
			t.Errorf("cli get foreign: %d %s", code, errOut)
		}
	}
	// Both sandboxes are untouched by the other org's attempts.
	for key, id := range map[string]string{a: sa.ID, b: sb.ID} {
		if got := in.Get(key, id); got.Desired != "running" {
			t.Errorf("%s desired %s after foreign stop/delete attempts", id, got.Desired)
		}
	}
	// A revoked key authenticates nothing.
	k := in.MustCLI(a, "key", "create", "--name", "temp", "-o", "json")
	var created struct{ ID, Secret string }
	json.Unmarshal([]byte(k), &created)
	in.MustCLI(a, "key", "revoke", created.ID)
	if status, body := in.Call(created.Secret, "GET", "/v1/sandboxes", ""); status != 401 || errorCode(t, body) != "unauthorized" {
		t.Errorf("revoked key: %d %s", status, body)
	}
	// Org B cannot revoke org A's key.
	keys := in.MustCLI(a, "key", "list", "-o", "json")
	var list []struct{ ID string }
	json.Unmarshal([]byte(keys), &list)
	if status, _ := in.Call(b, "DELETE", "/v1/keys/"+list[0].ID, ""); status != 404 {
		t.Errorf("org b revoked org a's key: %d", status)
	}
}

// TestQuotaUnderConcurrentCreates: 20 concurrent creates against a quota of
// 5 make exactly 5 sandboxes, in the record and in the e2e.SharedCluster(t).
func TestQuotaUnderConcurrentCreates(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	key := in.NewOrg("quota", 5, 5)
	var wg sync.WaitGroup
	statuses := make([]int, 20)
	bodies := make([]string, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], bodies[i] = in.Call(key, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
		}()
	}
	wg.Wait()
	created, refused := 0, 0
	for i, s := range statuses {
		switch s {
		case 201:
			created++
		case 429:
			if c := errorCode(t, bodies[i]); c != "quota_exceeded" {
				t.Errorf("429 with code %s", c)
			}
			refused++
		default:
			t.Errorf("status %d: %s", s, bodies[i])
		}
	}
	if created != 5 || refused != 15 {
		t.Fatalf("created %d, refused %d; want 5 and 15", created, refused)
	}
	objs, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(in.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(objs.Items) != 5 {
		t.Fatalf("cluster has %d sandboxes (%v), want 5", len(objs.Items), err)
	}
	// Stopping one frees a running slot but not a sandbox slot.
	var first struct{ ID string }
	json.Unmarshal([]byte(bodies[indexOf(statuses, 201)]), &first)
	in.MustCLI(key, "sandbox", "stop", first.ID)
	if s, body := in.Call(key, "POST", "/v1/sandboxes", `{"image":"busybox"}`); s != 429 {
		t.Fatalf("sixth sandbox with max 5: %d %s", s, body)
	}
	// Deleting one frees both.
	in.MustCLI(key, "sandbox", "delete", first.ID)
	in.WaitState(key, first.ID, "deleted")
	if s, body := in.Call(key, "POST", "/v1/sandboxes", `{"image":"busybox"}`); s != 201 {
		t.Fatalf("create after delete: %d %s", s, body)
	}
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestIdempotentCreate: retries with one Idempotency-Key make one sandbox;
// the key reused with another body is refused.
func TestIdempotentCreate(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	body := `{"image":"busybox","labels":{"run":"1"}}`
	var ids sync.Map
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, b := in.Call(in.Token, "POST", "/v1/sandboxes", body, "Idempotency-Key", "retry-1")
			if s != 201 && s != 200 {
				t.Errorf("retry: %d %s", s, b)
				return
			}
			var sb struct{ ID string }
			json.Unmarshal([]byte(b), &sb)
			ids.Store(sb.ID, true)
		}()
	}
	wg.Wait()
	n := 0
	ids.Range(func(_, _ any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("10 retries made %d sandboxes", n)
	}
	s, b := in.Call(in.Token, "POST", "/v1/sandboxes", `{"image":"alpine"}`, "Idempotency-Key", "retry-1")
	if s != 409 || errorCode(t, b) != "idempotency_conflict" {
		t.Fatalf("key reused with another body: %d %s", s, b)
	}
	// The CLI flag does the same.
	one := in.Create(in.Token, "busybox", "--idempotency-key", "cli-1")
	two := in.Create(in.Token, "busybox", "--idempotency-key", "cli-1")
	if one.ID != two.ID {
		t.Fatalf("cli retry made %s and %s", one.ID, two.ID)
	}
}

// TestMalformedRequests: each bad request gets its 4xx and stable code,
// never a 5xx, and leaves nothing behind.
func TestMalformedRequests(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox")
	huge := `{"image":"` + strings.Repeat("a", 70<<10) + `"}`
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"no token", "GET", "/v1/sandboxes", "", 401, "unauthorized"},
		{"unknown path", "GET", "/v1/nope", "", 404, "not_found"},
		{"wrong method", "PUT", "/v1/sandboxes", "{}", 405, "method_not_allowed"},
		{"empty body", "POST", "/v1/sandboxes", "", 400, "invalid_json"},
		{"not json", "POST", "/v1/sandboxes", "image=busybox", 400, "invalid_json"},
		{"truncated json", "POST", "/v1/sandboxes", `{"image":"busybox"`, 400, "invalid_json"},
		{"two values", "POST", "/v1/sandboxes", `{"image":"busybox"}{}`, 400, "invalid_json"},
		{"array body", "POST", "/v1/sandboxes", `[]`, 400, "invalid_field"},
		{"unknown field", "POST", "/v1/sandboxes", `{"image":"busybox","privileged":true}`, 400, "unknown_field"},
		{"unknown nested field", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"gpu":"1"}}`, 400, "unknown_field"},
		{"wrong type", "POST", "/v1/sandboxes", `{"image":42}`, 400, "invalid_field"},
		{"body too large", "POST", "/v1/sandboxes", huge, 413, "body_too_large"},
		{"missing image", "POST", "/v1/sandboxes", `{}`, 400, "invalid_field"},
		{"bad image", "POST", "/v1/sandboxes", `{"image":"Not An Image!"}`, 400, "invalid_field"},
		{"image with spaces", "POST", "/v1/sandboxes", `{"image":"busy box"}`, 400, "invalid_field"},
		{"bad cpu", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu_request":"lots"}}`, 400, "invalid_field"},
		{"negative cpu", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu_request":"-1"}}`, 400, "invalid_field"},
		{"absurd memory", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory_limit":"900Pi"}}`, 400, "invalid_field"},
		{"request over limit", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu_request":"2","cpu_limit":"1"}}`, 400, "invalid_field"},
		{"bad ttl", "POST", "/v1/sandboxes", `{"image":"busybox","ttl":"forever"}`, 400, "invalid_field"},
		{"negative ttl", "POST", "/v1/sandboxes", `{"image":"busybox","ttl":"-1h"}`, 400, "invalid_field"},
		{"ttl too long", "POST", "/v1/sandboxes", `{"image":"busybox","ttl":"9000h"}`, 400, "invalid_field"},
		{"ttl too short", "POST", "/v1/sandboxes", `{"image":"busybox","ttl":"1ms"}`, 400, "invalid_field"},
		{"bad shutdown policy", "POST", "/v1/sandboxes", `{"image":"busybox","shutdown_policy":"explode"}`, 400, "invalid_field"},
		{"duplicate volume names", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","size":"1Gi","mount_path":"/a"},{"name":"a","size":"1Gi","mount_path":"/b"}]}`, 400, "invalid_field"},
		{"duplicate mount paths", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","size":"1Gi","mount_path":"/a"},{"name":"b","size":"1Gi","mount_path":"/a"}]}`, 400, "invalid_field"},
		{"relative mount path", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","size":"1Gi","mount_path":"data"}]}`, 400, "invalid_field"},
		{"unclean mount path", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","size":"1Gi","mount_path":"/a/../etc"}]}`, 400, "invalid_field"},
		{"zero volume size", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","size":"0","mount_path":"/a"}]}`, 400, "invalid_field"},
		{"missing volume size", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","mount_path":"/a"}]}`, 400, "invalid_field"},
		{"bad volume name", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"A_B","size":"1Gi","mount_path":"/a"}]}`, 400, "invalid_field"},
		{"unbacked storage class", "POST", "/v1/sandboxes", `{"image":"busybox","volumes":[{"name":"a","size":"1Gi","mount_path":"/a","storage_class":"gold"}]}`, 422, "unsupported_capability"},
		{"unbacked transport", "POST", "/v1/sandboxes", `{"image":"busybox","transports":["rdp"]}`, 422, "unsupported_capability"},
		{"bad label key", "POST", "/v1/sandboxes", `{"image":"busybox","labels":{"-bad":"x"}}`, 400, "invalid_field"},
		{"bad label value", "POST", "/v1/sandboxes", `{"image":"busybox","labels":{"k":"has space"}}`, 400, "invalid_field"},
		{"wrong content type", "POST", "/v1/sandboxes", `{"image":"busybox"}`, 415, "unsupported_media_type"},
		{"bad state filter", "GET", "/v1/sandboxes?state=flying", "", 400, "invalid_field"},
		{"bad limit", "GET", "/v1/sandboxes?limit=0", "", 400, "invalid_field"},
		{"huge limit", "GET", "/v1/sandboxes?limit=100000", "", 400, "invalid_field"},
		{"bad label filter", "GET", "/v1/sandboxes?label=novalue", "", 400, "invalid_field"},
		{"unknown query", "GET", "/v1/sandboxes?color=red", "", 400, "unknown_field"},
		{"absent sandbox", "GET", "/v1/sandboxes/sbx_nothere", "", 404, "not_found"},
		{"patch without ttl", "PATCH", "/v1/sandboxes/" + sb.ID, `{}`, 400, "invalid_field"},
		{"patch bad ttl", "PATCH", "/v1/sandboxes/" + sb.ID, `{"ttl":"0s"}`, 400, "invalid_field"},
		{"patch unknown field", "PATCH", "/v1/sandboxes/" + sb.ID, `{"image":"alpine"}`, 400, "unknown_field"},
		{"stop with junk body", "POST", "/v1/sandboxes/" + sb.ID + "/stop", `{"force":true}`, 400, "unknown_field"},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			token := in.Token
			if tc.code == "unauthorized" {
				token = ""
			}
			var status int
			var body string
			if tc.code == "unsupported_media_type" {
				status, body = in.Call(token, tc.method, tc.path, tc.body, "Content-Type", "text/plain")
			} else {
				status, body = in.Call(token, tc.method, tc.path, tc.body)
			}
			if status != tc.status || errorCode(t, body) != tc.code {
				t.Fatalf("got %d %s, want %d %s", status, body, tc.status, tc.code)
			}
		})
	}
	// Nothing half-written: one sandbox in the record, one in the e2e.SharedCluster(t).
	status, body := in.Call(in.Token, "GET", "/v1/sandboxes", "")
	var list struct{ Items []struct{ ID string } }
	json.Unmarshal([]byte(body), &list)
	if status != 200 || len(list.Items) != 1 {
		t.Fatalf("record holds %d sandboxes after bad requests", len(list.Items))
	}
	objs, _ := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(in.NS).List(context.Background(), metav1.ListOptions{})
	if len(objs.Items) != 1 {
		t.Fatalf("cluster holds %d sandboxes after bad requests", len(objs.Items))
	}
	if strings.Contains(in.Out.String(), "level=ERROR") {
		t.Fatalf("bad input logged an error:\n%s", in.Out.String())
	}
}

// TestClusterRefusesCreate: when the cluster refuses the Sandbox (here a
// ValidatingAdmissionPolicy, the same kind of gate the isolation policy is),
// the API answers an error and the record says failed; it never stays
// pending, and nothing is left in the e2e.SharedCluster(t).
func TestClusterRefusesCreate(t *testing.T) {
	ns := e2e.NewNamespace(t)
	policy := `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: refuse-` + ns + `}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["agents.x-k8s.io"]
      apiVersions: ["*"]
      operations: ["CREATE"]
      resources: ["sandboxes"]
  validations:
  - expression: "!has(object.metadata.labels) || !('hiloop.dev/sandbox' in object.metadata.labels)"
    message: "sandboxes are closed in this namespace"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: refuse-` + ns + `}
spec:
  policyName: refuse-` + ns + `
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: ` + ns + `}
`
	e2e.Kubectl(t, "apply", "-f", writeTemp(t, policy))
	t.Cleanup(func() { e2e.SharedCluster(t).Kubectl(context.Background(), "delete", "-f", writeTemp(t, policy)) })
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), ns)
	// The API server loads policies asynchronously: retry until it refuses.
	var status int
	var body string
	eventually.Within(t, "policy in force", 30*time.Second, func() (bool, error) {
		status, body = tryCreate(t, in)
		return status != http.StatusCreated, nil
	})
	// What the cluster said is logged, not sent: it names the object.
	if status != 422 || errorCode(t, body) != "cluster_rejected" || strings.Contains(body, "sandboxes are closed") || strings.Contains(body, "sbx-") {
		t.Fatalf("refused create: %d %s", status, body)
	}
	// The log reaches the test through a pipe, after the answer.
	eventually.Within(t, "the refusal in the log", 10*time.Second, func() (bool, error) {
		return strings.Contains(in.Out.String(), "sandboxes are closed"), fmt.Errorf("log:\n%s", in.Out.String())
	})
	list := in.MustCLI(in.Token, "sandbox", "list", "--state", "failed", "-o", "json")
	var l struct {
		Items []struct{ ID, Reason string }
	}
	json.Unmarshal([]byte(list), &l)
	if len(l.Items) == 0 || !strings.Contains(l.Items[len(l.Items)-1].Reason, "the cluster refused the sandbox") {
		t.Fatalf("no failed record naming the refusal: %s", list)
	}
	failed := l.Items[len(l.Items)-1].ID
	if _, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).Get(context.Background(), k8s.ObjectName(failed), metav1.GetOptions{}); err == nil {
		t.Fatal("a refused sandbox has an object in the cluster")
	}
	// A failed sandbox counts against no quota and deletes cleanly.
	in.MustCLI(in.Token, "sandbox", "delete", failed)
}
