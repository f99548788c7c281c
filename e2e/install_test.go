package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/localcluster"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// doctor runs `hiloop doctor` as a user does, against the local cluster's
// rendering of the chart unless args name another (--boundary-file).
func doctor(t *testing.T, args ...string) (string, int) {
	t.Helper()
	if !slices.Contains(args, "--boundary-file") {
		args = append(args, "--boundary-file", e2e.LocalBoundary(t))
	}
	cmd := exec.Command(e2e.Binary(t), append([]string{"doctor"}, args...)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// boundaryChecks is how many checks doctor prints: the cluster, the Sandbox
// API, the self-check's nine (namespace, RuntimeClass, two policies, two
// bindings, quota, NetworkPolicies, foreign Sandboxes) and the egress check.
const boundaryChecks = 12

// allowAll is a NetworkPolicy that allows every connection both ways.
const allowAll = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress: [{}]
  egress: [{}]
`

// TestSelfCheck weakens the boundary of a cluster of its own (the shared
// one's policies are everyone's) and checks that hiloop refuses creates and
// starts within the check interval, says why in the answer, stays ready
// (/readyz names only the state), keeps serving reads and mirroring, and
// lifts the refusal once the boundary is back. hiloop doctor reports the
// same, and shows the egress check with the API server's real address.
func TestSelfCheck(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := context.Background()
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), c.Namespace, "--kubeconfig", c.Kubeconfig, "--self-check-interval", "1s")
	running := in.Create(in.Token, "busybox", "--wait")
	stopped := in.Create(in.Token, "busybox", "--wait")
	in.MustCLI(in.Token, "sandbox", "stop", stopped.ID)
	in.WaitState(in.Token, stopped.ID, "stopped")
	out, code := doctor(t, "--kubeconfig", c.Kubeconfig)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("all %d checks pass", boundaryChecks)) {
		t.Fatalf("doctor on a hardened cluster: exit %d\n%s", code, out)
	}
	// The egress check names the API server's address as the cluster
	// publishes it.
	apiAddr := apiServerAddr(t, c) + ":" + strings.TrimSpace(kc(t, c, "get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes",
		"-o", "jsonpath={.items[0].ports[0].port}"))
	if want := "ok      Egress from namespace " + c.Namespace + " to the API server (" + apiAddr + ")"; !strings.Contains(out, want) {
		t.Errorf("doctor: no %q in\n%s", want, out)
	}
	t.Logf("doctor on the local cluster:\n%s", out)

	refused := func(object string) {
		t.Helper()
		eventually.Within(t, "creates refused naming "+object, 15*time.Second, func() (bool, error) {
			// Created before the self-check noticed: deleted again.
			status, body := tryCreate(t, in)
			return status == 503 && errorCode(t, body) == "cluster_not_hardened" && strings.Contains(body, object), fmt.Errorf("%d %s", status, body)
		})
		if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+stopped.ID+"/start", ""); status != 503 || errorCode(t, body) != "cluster_not_hardened" {
			t.Errorf("start while not hardened: %d %s", status, body)
		}
		// Ready all the same, and saying only the state.
		if status, body := in.Call("", "GET", "/readyz", ""); status != 200 || !strings.Contains(body, `"not_hardened"`) || strings.Contains(body, object) {
			t.Errorf("/readyz while not hardened: %d %s", status, body)
		}
		// Reads go on; the mirror goes on.
		if status, body := in.Call(in.Token, "GET", "/v1/sandboxes/"+running.ID, ""); status != 200 || !strings.Contains(body, `"running"`) {
			t.Errorf("read while not hardened: %d %s", status, body)
		}
	}
	lifted := func() {
		t.Helper()
		eventually.Within(t, "refusal lifted", 15*time.Second, func() (bool, error) {
			status, body := in.Call("", "GET", "/readyz", "")
			return status == 200 && strings.Contains(body, `"hardened"`), fmt.Errorf("%d %s", status, body)
		})
		sb := in.Create(in.Token, "busybox", "--wait")
		in.MustCLI(in.Token, "sandbox", "delete", sb.ID)
	}
	kubectl := func(args ...string) {
		t.Helper()
		if out, err := c.Kubectl(ctx, args...); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}

	// The binding deleted.
	kubectl("delete", "validatingadmissionpolicybinding", boundary.PolicySandbox)
	refused("ValidatingAdmissionPolicyBinding " + boundary.PolicySandbox)
	out, code = doctor(t, "--kubeconfig", c.Kubeconfig)
	if code != 1 || !strings.Contains(out, "FAIL    ValidatingAdmissionPolicyBinding "+boundary.PolicySandbox+": missing") || !strings.Contains(out, "fix: ") {
		t.Errorf("doctor without the binding: exit %d\n%s", code, out)
	}
	// Mirroring goes on: a stop outside hiloop is still seen.
	kubectl("patch", "sandbox", "-n", c.Namespace, k8s.ObjectName(running.ID), "--type=merge", "-p", `{"spec":{"operatingMode":"Suspended"}}`)
	in.WaitState(in.Token, running.ID, "stopped")
	if err := c.InstallBoundary(ctx); err != nil {
		t.Fatal(err)
	}
	lifted()
	in.MustCLI(in.Token, "sandbox", "start", running.ID)
	in.WaitState(in.Token, running.ID, "running")

	// failurePolicy relaxed.
	kubectl("patch", "validatingadmissionpolicy", boundary.PolicyPod, "--type=merge", "-p", `{"spec":{"failurePolicy":"Ignore"}}`)
	refused("ValidatingAdmissionPolicy " + boundary.PolicyPod)
	kubectl("patch", "validatingadmissionpolicy", boundary.PolicyPod, "--type=merge", "-p", `{"spec":{"failurePolicy":"Fail"}}`)
	lifted()

	// The namespace's Pod Security weakened.
	kubectl("label", "--overwrite", "namespace", c.Namespace, "pod-security.kubernetes.io/enforce=privileged")
	refused("Namespace " + c.Namespace)
	kubectl("label", "--overwrite", "namespace", c.Namespace, "pod-security.kubernetes.io/enforce=baseline")
	lifted()

	// A second NetworkPolicy that allows everything, beside the chart's.
	kubectl("apply", "-n", c.Namespace, "-f", writeTemp(t, allowAll))
	refused("NetworkPolicy allow-all allows more than the chart's")
	kubectl("delete", "networkpolicy", "-n", c.Namespace, "allow-all")
	lifted()

	// A namespace with none of the boundary fails every namespaced check.
	kubectl("create", "namespace", "plain")
	out, code = doctor(t, "--kubeconfig", c.Kubeconfig, "--namespace", "plain")
	for _, want := range []string{"FAIL    Namespace plain: Pod Security enforce", "FAIL    ResourceQuota plain/hiloop-sandboxes: missing",
		"FAIL    NetworkPolicies in namespace plain: no NetworkPolicy that selects every pod restricts ingress",
		"does not select namespace plain", "fix: kubectl label", "sandboxes can reach the API server at"} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("doctor on an unhardened namespace: exit %d, no %q in\n%s", code, want, out)
		}
	}
}

// kc runs kubectl against cluster c.
func kc(t *testing.T, c *localcluster.Cluster, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(context.Background(), args...)
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return out
}

// apiServerAddr is the address the cluster's API server advertises, as its
// kubernetes EndpointSlice names it: the local cluster's is the machine's.
func apiServerAddr(t *testing.T, c *localcluster.Cluster) string {
	t.Helper()
	addr := strings.TrimSpace(kc(t, c, "get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes",
		"-o", "jsonpath={.items[0].endpoints[0].addresses[0]}"))
	if addr == "" {
		t.Fatal("the API server's EndpointSlice names no address")
	}
	return addr
}

// TestBrokenBoundaryServes breaks one boundary object while hiloop serves,
// as an attacker or a careless upgrade would: /readyz stays 200, reads,
// exec, stops and deletes go on, and creates and starts answer 503
// cluster_not_hardened naming the object, until it is back.
func TestBrokenBoundaryServes(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := context.Background()
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), c.Namespace, "--kubeconfig", c.Kubeconfig, "--self-check-interval", "1s")
	var sbs []e2e.Sandbox
	for range 3 {
		sbs = append(sbs, in.Create(in.Token, "busybox", "--wait"))
	}
	if out, err := c.Kubectl(ctx, "patch", "resourcequota", "-n", c.Namespace, boundary.QuotaName, "--type=merge",
		"-p", `{"spec":{"hard":{"count/sandboxes.agents.x-k8s.io":"1000000"}}}`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	object := "ResourceQuota " + c.Namespace + "/" + boundary.QuotaName
	eventually.Within(t, "creates refused naming the quota", 15*time.Second, func() (bool, error) {
		status, body := tryCreate(t, in)
		return status == 503 && errorCode(t, body) == "cluster_not_hardened" && strings.Contains(body, object) &&
			strings.Contains(body, "above the chart's"), fmt.Errorf("%d %s", status, body)
	})
	if status, body := in.Call("", "GET", "/readyz", ""); status != 200 || !strings.Contains(body, `"not_hardened"`) || strings.Contains(body, "ResourceQuota") {
		t.Errorf("/readyz: %d %s", status, body)
	}
	for _, sb := range sbs {
		if got := in.Get(in.Token, sb.ID); got.State != "running" {
			t.Errorf("read %s while not hardened: %s", sb.ID, got.State)
		}
	}
	if _, _, code := in.CLI(in.Token, "sandbox", "exec", sbs[0].ID, "--", "sh", "-c", "exit 4"); code != 4 {
		t.Errorf("exec while not hardened: exit %d", code)
	}
	in.MustCLI(in.Token, "sandbox", "stop", sbs[1].ID)
	in.WaitState(in.Token, sbs[1].ID, "stopped")
	if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sbs[1].ID+"/start", ""); status != 503 || errorCode(t, body) != "cluster_not_hardened" ||
		!strings.Contains(body, object) {
		t.Errorf("start while not hardened: %d %s", status, body)
	}
	in.MustCLI(in.Token, "sandbox", "delete", sbs[2].ID)
	in.WaitState(in.Token, sbs[2].ID, "deleted")
	if status, body := in.Call("", "GET", "/readyz", ""); status != 200 {
		t.Errorf("/readyz after the stop and delete: %d %s", status, body)
	}

	if out, err := c.Kubectl(ctx, "patch", "resourcequota", "-n", c.Namespace, boundary.QuotaName, "--type=merge",
		"-p", `{"spec":{"hard":{"count/sandboxes.agents.x-k8s.io":"100000"}}}`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	eventually.Within(t, "refusal lifted", 15*time.Second, func() (bool, error) {
		status, body := in.Call("", "GET", "/readyz", "")
		return status == 200 && strings.Contains(body, `"hardened"`), fmt.Errorf("%d %s", status, body)
	})
	in.MustCLI(in.Token, "sandbox", "start", sbs[1].ID)
	in.WaitState(in.Token, sbs[1].ID, "running")
}

// TestInsecureNoGVisor: the development mode for clusters without gVisor.
// On a hardened cluster it is refused by admission, naming the policy (422);
// with the chart installed with gvisor.required=false it runs sandboxes
// without a runtime class, says so at start, in /readyz, in every sandbox
// and in doctor, and the self-check counts the gap as allowed.
func TestInsecureNoGVisor(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "h.db")
	kc := func(args ...string) string {
		t.Helper()
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	in := e2e.Serve(t, db, c.Namespace, "--kubeconfig", c.Kubeconfig, "--insecure-no-gvisor")
	if !strings.Contains(in.Out.String(), "WARNING: --insecure-no-gvisor") {
		t.Errorf("no warning at start:\n%s", in.Out.String())
	}
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if status != 422 || errorCode(t, body) != "cluster_rejected" ||
		!strings.Contains(body, "admission policy "+boundary.PolicySandbox+" refused the sandbox: [runtime-class]") {
		t.Fatalf("insecure create on a hardened cluster: %d %s", status, body)
	}
	if n := strings.Count(kc("get", "sandboxes", "-n", c.Namespace, "-o", "name"), "sandbox"); n != 0 {
		t.Errorf("%d Sandbox objects after a refused create", n)
	}
	in.Stop()
	token := in.Token

	// The chart for a cluster without gVisor.
	rendering := helmTemplate(t, "-f", e2e.Path(t, "deploy/chart/values-local.yaml"), "--set", "gvisor.required=false",
		"--set", "networkPolicy.cluster.apiServer={"+apiServerAddr(t, c)+"}")
	if _, err := c.Kubectl(ctx, "apply", "-f", writeTemp(t, rendering)); err != nil {
		t.Fatal(err)
	}
	// Admission picks up the changed policies a moment later.
	eventually.Within(t, "a Sandbox without a runtime class admitted", 30*time.Second, func() (bool, error) {
		obj, err := k8s.Render(store.Sandbox{ID: "sbx_probe", OrgID: "org_probe", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}},
			k8s.RenderOptions{Namespace: c.Namespace, NoGVisor: true, Transports: []receipt.Transport{receipt.TransportExec}})
		if err != nil {
			return false, err
		}
		_, err = c.Clients.Sandbox.AgentsV1beta1().Sandboxes(c.Namespace).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, err
	})
	in = e2e.Serve(t, db, c.Namespace, "--kubeconfig", c.Kubeconfig, "--insecure-no-gvisor")
	status, body = in.Call("", "GET", "/readyz", "")
	if status != 200 || !strings.Contains(body, `"boundary": "insecure"`) {
		t.Errorf("/readyz in insecure mode: %d %s", status, body)
	}
	sb := in.Create(token, "busybox", "--wait")
	if sb.Isolation != "insecure-no-gvisor" {
		t.Errorf("isolation %q", sb.Isolation)
	}
	if rc := kc("get", "pod", "-n", c.Namespace, k8s.ObjectName(sb.ID), "-o", "jsonpath={.spec.runtimeClassName}"); rc != "" {
		t.Errorf("pod runtime class %q", rc)
	}
	receipt := kc("get", "sandbox", "-n", c.Namespace, k8s.ObjectName(sb.ID), "-o", `jsonpath={.spec.podTemplate.metadata.annotations.hiloop\.dev/runtime-receipt}`)
	if !strings.Contains(receipt, `"insecure":"no-gvisor"`) {
		t.Errorf("receipt %s", receipt)
	}
	out, code := doctor(t, "--kubeconfig", c.Kubeconfig, "--insecure-no-gvisor")
	if code != 0 || !strings.Contains(out, "allowed RuntimeClass (none)") || !strings.Contains(out, "allowed ValidatingAdmissionPolicy") {
		t.Errorf("doctor in insecure mode: exit %d\n%s", code, out)
	}
	// Without the flag, the same cluster is not hardened.
	if out, code := doctor(t, "--kubeconfig", c.Kubeconfig); code != 1 || !strings.Contains(out, "rule [runtime-class] is missing") {
		t.Errorf("doctor without the flag: exit %d\n%s", code, out)
	}
}

// helmTemplate renders the chart with the pinned helm.
func helmTemplate(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(os.Getenv("HILOOP_CLUSTER_BIN"), "helm"), append([]string{"template", "hiloop", e2e.Path(t, "deploy/chart")}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return string(out)
}

// TestClusterQuota: the chart's quota refuses the N+1th Sandbox, and hiloop
// answers 429 cluster_quota_exceeded, leaving a failed record and no object.
func TestClusterQuota(t *testing.T) {
	ns := e2e.NewNamespace(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), ns)
	e2e.Kubectl(t, "patch", "resourcequota", "-n", ns, boundary.QuotaName, "--type=merge", "-p", `{"spec":{"hard":{"count/sandboxes.agents.x-k8s.io":"2"}}}`)
	eventually.Within(t, "quota of 2 computed", 30*time.Second, func() (bool, error) {
		q, err := e2e.SharedCluster(t).Clients.Kube.CoreV1().ResourceQuotas(ns).Get(context.Background(), boundary.QuotaName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		hard := q.Status.Hard["count/sandboxes.agents.x-k8s.io"]
		return hard.String() == "2", fmt.Errorf("status.hard %s", hard.String())
	})
	in.Create(in.Token, "busybox")
	in.Create(in.Token, "busybox")
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if status != 429 || errorCode(t, body) != "cluster_quota_exceeded" {
		t.Fatalf("third create: %d %s", status, body)
	}
	if strings.Contains(body, ns) || strings.Contains(body, "exceeded quota: ") {
		t.Errorf("the answer carries the cluster's message: %s", body)
	}
	if n := strings.Count(e2e.Kubectl(t, "get", "sandboxes", "-n", ns, "-o", "name"), "sandbox"); n != 2 {
		t.Errorf("%d Sandbox objects, want 2", n)
	}
	var list struct{ Items []e2e.Sandbox }
	_, body = in.Call(in.Token, "GET", "/v1/sandboxes", "")
	json.Unmarshal([]byte(body), &list)
	failed := 0
	for _, sb := range list.Items {
		if sb.State == "failed" {
			failed++
		}
	}
	if len(list.Items) != 3 || failed != 1 {
		t.Errorf("records: %d, failed %d: %s", len(list.Items), failed, body)
	}
}

// TestBoundaryReadBack: the chart's boundary as the real API server stores
// it (defaults filled in) passes the self-check, field for field, and the
// NetworkPolicy read back denies every default range (nothing enforces it
// in the local cluster: there is no CNI).
func TestBoundaryReadBack(t *testing.T) {
	c := e2e.SharedCluster(t)
	exp, err := boundary.Parse(localcluster.BoundaryYAML())
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range boundary.Check(context.Background(), c.Clients, boundary.Options{Namespace: k8s.DefaultNamespace,
		RuntimeClass: k8s.DefaultRuntimeClass, SessionPort: k8s.DefaultSessionPort, Expected: exp}) {
		if !ch.OK {
			t.Errorf("%s: %s (%s)", ch.Object, ch.Problem, ch.Detail)
		}
	}
	np, err := c.Clients.Kube.NetworkingV1().NetworkPolicies(k8s.DefaultNamespace).Get(context.Background(), boundary.NetworkPolicy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var excepts []string
	for _, r := range np.Spec.Egress {
		for _, p := range r.To {
			if p.IPBlock != nil {
				excepts = append(excepts, p.IPBlock.Except...)
			}
		}
	}
	for _, d := range boundary.DeniedCIDRs {
		if !slices.Contains(excepts, d) {
			t.Errorf("egress does not except %s: %v", d, excepts)
		}
	}
}

// TestLeastPrivilege runs hiloop serve with only the chart's ServiceAccount
// token, under the chart's admission policies, through the whole lifecycle
// (a sandbox with the session helper and volumes), exec, ssh, ssh -L and a
// gateway key rotation, and checks with `kubectl auth can-i` what that
// account cannot do.
func TestLeastPrivilege(t *testing.T) {
	requireSSH(t)
	c := e2e.SharedCluster(t)
	const sa = "system:serviceaccount:hiloop-system:hiloop"
	token := strings.TrimSpace(e2e.Kubectl(t, "create", "token", "hiloop", "-n", "hiloop-system", "--duration", "1h"))
	server := e2e.Kubectl(t, "config", "view", "--raw", "--minify", "--flatten", "-o", "jsonpath={.clusters[0].cluster.server}")
	ca := e2e.Kubectl(t, "config", "view", "--raw", "--minify", "--flatten", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}")
	kubeconfig := writeTemp(t, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority-data: %q}}]
users: [{name: hiloop, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: hiloop}}]
current-context: c
`, server, ca, token))

	dir := e2e.Helpers(t)
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), k8s.DefaultNamespace, "--kubeconfig", kubeconfig,
		"--transports", "exec,ssh,forward", "--agent-image", "hiloop-agent:local")
	sb := in.Create(in.Token, "busybox", "--volume", "data:1Gi:/data", "--volume", "cache:1Gi:/cache:kwok-volume", "--ttl", "1h", "--wait")
	if _, _, code := in.CLI(in.Token, "sandbox", "exec", sb.ID, "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("exec as the service account: exit %d", code)
	}
	u := newSSHUser(t, in, in.Token)
	if _, errOut, code := u.run(sb.ID, "exit 7"); code != 7 {
		t.Errorf("ssh as the service account: exit %d %s", code, errOut)
	}
	waitHelper(t, in, dir, sb.ID)
	port := echoServer(t)
	local, _, _ := forward(t, u, sb.ID, port)
	roundTrip(t, local, 1<<20)
	in.MustCLI(in.Token, "sandbox", "ttl", sb.ID, "2h")
	in.MustCLI("", "ssh-rotate-agent-key", "--kubeconfig", kubeconfig, "--namespace", k8s.DefaultNamespace)
	local2, _, _ := forward(t, u, sb.ID, port)
	eventually.Within(t, "-L with the rotated key", 60*time.Second, func() (bool, error) {
		c, err := net.Dial("tcp", local2)
		if err != nil {
			return false, err
		}
		defer c.Close()
		c.Write([]byte("ping"))
		c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		return string(got) == "ping", err
	})
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	in.WaitState(in.Token, sb.ID, "stopped")
	in.MustCLI(in.Token, "sandbox", "start", sb.ID)
	in.WaitState(in.Token, sb.ID, "running")
	in.MustCLI(in.Token, "sandbox", "delete", sb.ID)
	in.WaitState(in.Token, sb.ID, "deleted")
	if strings.Contains(in.Out.String(), "forbidden") {
		t.Errorf("a request was forbidden:\n%s", in.Out.String())
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "sandboxes.agents.x-k8s.io", "-n", k8s.DefaultNamespace}, "yes"},
		{[]string{"create", "pods", "--subresource=exec", "-n", k8s.DefaultNamespace}, "yes"},
		{[]string{"get", "secrets", "-n", k8s.DefaultNamespace}, "no"},
		{[]string{"list", "secrets", "-A"}, "no"},
		{[]string{"get", "secrets", "-n", "hiloop-system"}, "no"},
		{[]string{"create", "pods", "-n", k8s.DefaultNamespace}, "no"},
		{[]string{"delete", "pods", "-n", k8s.DefaultNamespace}, "no"},
		{[]string{"create", "sandboxes.agents.x-k8s.io", "-n", "default"}, "no"},
		{[]string{"list", "pods", "-n", "kube-system"}, "no"},
		{[]string{"create", "pods", "--subresource=exec", "-n", "kube-system"}, "no"},
		{[]string{"update", "validatingadmissionpolicies/" + boundary.PolicySandbox}, "no"},
		{[]string{"delete", "validatingadmissionpolicybindings/" + boundary.PolicySandbox}, "no"},
		{[]string{"create", "validatingadmissionpolicybindings"}, "no"},
		{[]string{"patch", "namespaces/" + k8s.DefaultNamespace}, "no"},
		{[]string{"delete", "networkpolicies/" + boundary.NetworkPolicy, "-n", k8s.DefaultNamespace}, "no"},
		{[]string{"update", "resourcequotas/" + boundary.QuotaName, "-n", k8s.DefaultNamespace}, "no"},
		{[]string{"create", "rolebindings", "-n", k8s.DefaultNamespace}, "no"},
		{[]string{"create", "serviceaccounts", "--subresource=token", "-n", k8s.DefaultNamespace}, "no"},
	} {
		out, _ := c.Kubectl(context.Background(), append([]string{"auth", "can-i", "--as", sa}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(out), "\n") // a warning may come first
		if got := strings.TrimSpace(lines[len(lines)-1]); got != tc.want {
			t.Errorf("can-i %s: %q, want %s", strings.Join(tc.args, " "), got, tc.want)
		}
	}
}

// TestInstallManifestApplies applies deploy/hiloop.yaml, the chart's default
// rendering, to a cluster of its own, as an operator's `kubectl apply -f`
// does: the real API server accepts every object (the full upstream CRD
// included), and kwok's simulated node brings hiloop's Deployment, on its
// volume, and the agent-sandbox controller to available. No image runs
// here: kwok fakes the containers.
func TestInstallManifestApplies(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := context.Background()
	// Server-side: the CRD is too large for kubectl's last-applied annotation.
	if out, err := c.Kubectl(ctx, "apply", "--server-side", "--force-conflicts", "-f", e2e.Path(t, "deploy/hiloop.yaml")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, d := range []string{"hiloop-system/hiloop", "agent-sandbox-system/agent-sandbox-controller"} {
		ns, name, _ := strings.Cut(d, "/")
		if out, err := c.Kubectl(ctx, "rollout", "status", "-n", ns, "deployment/"+name, "--timeout", "90s"); err != nil {
			t.Errorf("%s: %v\n%s", d, err, out)
		}
	}
	if phase, err := c.Kubectl(ctx, "get", "pvc", "-n", "hiloop-system", "hiloop-data", "-o", "jsonpath={.status.phase}"); err != nil || phase != "Bound" {
		t.Errorf("hiloop's volume: %q %v", phase, err)
	}
	// The default rendering is what doctor holds a cluster to without
	// --boundary-file. Its egress exceptions do not know this cluster's
	// addresses: the API server advertises the machine's own address, and
	// unless that is in a range denied whatever the cluster, doctor's
	// egress check fails naming it, and only that check.
	out, code := doctor(t, "--kubeconfig", c.Kubeconfig, "--boundary-file", e2e.Path(t, "boundary/chart-boundary.yaml"))
	fails := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "FAIL") {
			fails++
			if !strings.Contains(l, "Egress from namespace") || !strings.Contains(l, "sandboxes can reach the API server at") {
				t.Errorf("doctor after kubectl apply: %s", l)
			}
		}
	}
	if (code == 0) != (fails == 0) || fails > 1 {
		t.Errorf("doctor after kubectl apply: exit %d\n%s", code, out)
	}
	t.Logf("doctor after kubectl apply of the default rendering:\n%s", out)
}
