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

// TestProcessHostileSandbox: what a sandbox answers of its processes is
// never trusted past what the scripts may say: an answer to an output
// read that is not the script's is a 4xx, never a server error; a status
// that is no exit status (out of range, signed, not a number), a
// negative or unreadable byte count, and lines about processes hiloop
// did not ask of (another sandbox's) change nothing in the record.
func TestProcessHostileSandbox(t *testing.T) {
	var status string
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(_ context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			if req.Stdin != nil {
				io.Copy(io.Discard, req.Stdin)
			}
			script := req.Command[2]
			switch {
			case strings.Contains(script, "setsid mkfifo"):
				io.WriteString(req.Stdout, "123\n")
			case strings.Contains(script, "echo ok"):
				io.WriteString(req.Stdout, "not ok\n")
			case strings.Contains(script, `echo "$i missing"`):
				io.WriteString(req.Stdout, status)
			}
			return cluster.ExitStatus{}, nil
		}}
	})
	ctx := context.Background()
	start := func(id string) api.Process {
		rec := ts.do("POST", "/v1/sandboxes/"+id+"/processes", `{"command":["sleep","9"]}`)
		var p api.Process
		if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &p) != nil {
			t.Fatalf("start: %d %s", rec.Code, rec.Body.String())
		}
		return p
	}
	id, other := ts.create(`{"image":"busybox"}`), ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, id, store.Observation{State: store.StateRunning, PodUID: "u1"})
	ts.db.Observe(ctx, other, store.Observation{State: store.StateRunning, PodUID: "u2"})
	p, q := start(id), start(other)

	rec := ts.do("GET", "/v1/sandboxes/"+id+"/processes/"+p.ID+"/output", "")
	if rec.Code >= 500 || rec.Code < 400 {
		t.Errorf("an output read the sandbox answered wrongly: %d %s", rec.Code, rec.Body.String())
	}

	for _, line := range []string{
		p.ID + " 256 1", p.ID + " -1 1", p.ID + " +7 1", p.ID + " 0x7 1", p.ID + " seven 1", p.ID + " 07x 1",
		p.ID + " running -5", p.ID + " running 99999999999999999999", p.ID + " running 1e3",
		q.ID + " 3 1\n" + p.ID + " running 4",
	} {
		status = line + "\n"
		rec := ts.do("GET", "/v1/sandboxes/"+id+"/processes/"+p.ID, "")
		var got api.Process
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got.State != api.ProcessRunning {
			t.Errorf("after the sandbox said %q: %d %s", line, rec.Code, rec.Body.String())
		}
		if got.OutputBytes != nil && *got.OutputBytes < 0 {
			t.Errorf("after the sandbox said %q: output_bytes %d", line, *got.OutputBytes)
		}
	}
	if got, err := ts.db.Process(ctx, ts.org.ID, other, q.ID); err != nil || got.State != store.ProcessRunning {
		t.Errorf("another sandbox's process after a sandbox spoke of it: %+v %v", got, err)
	}
}
