package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// TestProcessAnswers: what the sandbox says of a process operation is
// answered with its code, and the record keeps what was learnt: a start
// the image cannot run is 422 shell_unavailable and the process ended
// (start_failed), a signal to a process the sandbox says exited is 409
// process_not_running with its exit recorded, an offset older than what
// is kept is 410 output_gone, and a sandbox refusal is 422
// process_operation_failed with its words.
func TestProcessAnswers(t *testing.T) {
	// The scripts' exit status and stdout, by the script's first line.
	type reply struct {
		code int
		out  string
	}
	answer := map[string]reply{}
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(_ context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			if req.Stdin != nil {
				io.Copy(io.Discard, req.Stdin)
			}
			script := req.Command[2]
			for key, a := range answer {
				if strings.Contains(script, key) {
					io.WriteString(req.Stdout, a.out)
					io.WriteString(req.Stderr, "no space left on device")
					return cluster.ExitStatus{Code: a.code}, nil
				}
			}
			return cluster.ExitStatus{}, nil
		}}
	})
	ctx := context.Background()
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, id, store.Observation{State: store.StateRunning, PodUID: "u1"})
	base := "/v1/sandboxes/" + id + "/processes"

	answer["setsid mkfifo"] = reply{127, ""}
	rec := ts.do("POST", base, `{"command":["sleep","9"]}`)
	if rec.Code != http.StatusUnprocessableEntity || errCode(t, rec) != api.CodeShellUnavailable {
		t.Fatalf("start without the utilities: %d %s", rec.Code, rec.Body.String())
	}
	var l api.ProcessList
	json.Unmarshal(ts.do("GET", base, "").Body.Bytes(), &l)
	if len(l.Items) != 1 || l.Items[0].State != api.ProcessEnded || l.Items[0].Reason != api.EndStartFailed {
		t.Fatalf("after a failed start: %+v", l.Items)
	}
	delete(answer, "setsid mkfifo")

	answer["setsid mkfifo"] = reply{0, "123\n"}
	rec = ts.do("POST", base, `{"command":["sleep","9"]}`)
	var p api.Process
	if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &p) != nil || p.State != api.ProcessRunning {
		t.Fatalf("start: %d %s", rec.Code, rec.Body.String())
	}
	delete(answer, "setsid mkfifo")

	answer["exit 96"] = reply{96, ""}
	rec = ts.do("GET", base+"/"+p.ID+"/output?offset=0", "")
	if rec.Code != http.StatusGone || errCode(t, rec) != api.CodeOutputGone {
		t.Errorf("an offset older than what is kept: %d %s", rec.Code, rec.Body.String())
	}
	delete(answer, "exit 96")

	answer["sig \"$2\""] = reply{94, ""}
	rec = ts.do("POST", base+"/"+p.ID+"/signal", `{"signal":"HUP"}`)
	if rec.Code != http.StatusUnprocessableEntity || errCode(t, rec) != api.CodeProcessOperationFailed || !strings.Contains(rec.Body.String(), "no space left") {
		t.Errorf("a refused signal: %d %s", rec.Code, rec.Body.String())
	}
	answer["sig \"$2\""] = reply{97, "3\n"}
	rec = ts.do("POST", base+"/"+p.ID+"/signal", `{"signal":"TERM"}`)
	if rec.Code != http.StatusConflict || errCode(t, rec) != api.CodeProcessNotRunning {
		t.Fatalf("a signal to an exited process: %d %s", rec.Code, rec.Body.String())
	}
	got, err := ts.db.Process(ctx, ts.org.ID, id, p.ID)
	if err != nil || got.State != store.ProcessExited || got.ExitCode == nil || *got.ExitCode != 3 {
		t.Fatalf("the record after the sandbox said it exited: %+v %v", got, err)
	}
}
