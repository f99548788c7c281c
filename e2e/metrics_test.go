package e2e_test

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/internal/e2e"
)

// TestMetrics scrapes /metrics after some traffic: requests by route and
// code, authentication failures by kind, sandboxes by state, sessions by
// transport, the mirror's lag, the self-check; and no label value is an id.
func TestMetrics(t *testing.T) {
	requireSSH(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--metrics-listen", "127.0.0.1:0")
	if in.MetricsURL == "" {
		t.Fatalf("serve printed no metrics address:\n%s", in.Out.String())
	}
	sb := in.Create(in.Token, "busybox", "--wait")
	in.Call("hl_wrong", "GET", "/v1/org", "")
	u := newSSHUser(t, in, in.Token)
	if out, _, code := u.run(sb.ID, "echo metered"); code != 0 || out != "metered\n" {
		t.Fatalf("ssh: %d %q", code, out)
	}
	if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["echo","exec"]}`); status != 200 {
		t.Fatalf("exec: %d %s", status, body)
	}
	stranger := newSSHUser(t, in, in.NewOrg("metrics-b", 5, 5))
	stranger.run(sb.ID, "true")

	resp, err := http.Get(in.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	value := func(series string) float64 {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("no series %s", series)
			return 0
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	if value(`hiloop_api_requests_total{code="201",route="POST /v1/sandboxes"}`) < 1 {
		t.Error("the create is not counted")
	}
	if value(`hiloop_auth_failures_total{kind="api_key_invalid"}`) < 1 || value(`hiloop_auth_failures_total{kind="ssh_key_refused"}`) < 1 {
		t.Error("authentication failures are not counted")
	}
	if value(`hiloop_sandboxes{state="running"}`) != 1 || value(`hiloop_organizations`) != 2 {
		t.Error("sandboxes by state or organizations are wrong")
	}
	value(`hiloop_sessions{transport="ssh"}`)
	if value(`hiloop_session_bytes_total{direction="out",transport="ssh"}`) < float64(len("metered\n")) {
		t.Error("ssh output bytes are not counted")
	}
	if value(`hiloop_session_bytes_total{direction="out",transport="exec"}`) < float64(len("exec\n")) {
		t.Error("exec output bytes are not counted")
	}
	if value(`hiloop_mirror_lag_seconds_count`) < 1 {
		t.Error("the mirror's lag is not measured")
	}
	value(`hiloop_mirror_queue_depth`)
	if value(`hiloop_self_check{check="network_policy",object="NetworkPolicies in namespace `+in.NS+`"}`) != 1 ||
		value(`hiloop_self_check{check="admission_binding",object="ValidatingAdmissionPolicyBinding hiloop-pod-isolation"}`) != 1 {
		t.Error("the self-check is not reported as holding")
	}
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "hiloop_") {
			continue
		}
		if regexp.MustCompile(`"(sbx|key|org|sshk)_`).MatchString(l) {
			t.Errorf("a label value is an id: %s", l)
		}
	}
}
