package api

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// Background processes: commands started detached in a sandbox
// (POST /v1/sandboxes/{id}/processes), which outlive the call that started
// them. Their output (stdout and stderr together) is kept in the sandbox,
// the newest MaxProcessOutputKept bytes of it, and read from any kept
// offset; see docs/api.md.
const (
	// MaxProcessStdin caps one write to a process's stdin.
	MaxProcessStdin = 64 << 10
	// MaxProcessOutputKept is how much of a process's output the sandbox
	// keeps at least, the newest of it; up to about 2 MiB more may be
	// kept.
	MaxProcessOutputKept = 4 << 20
	// OutputOffsetHeader is the header of an output response that says
	// the offset its body begins at.
	OutputOffsetHeader = "Hiloop-Output-Offset"
)

// Process states.
const (
	// ProcessRunning: the process runs, as far as hiloop last saw.
	ProcessRunning = "running"
	// ProcessExited: it exited; ExitCode says how.
	ProcessExited = "exited"
	// ProcessEnded: it is gone without an exit status hiloop saw; Reason
	// says why.
	ProcessEnded = "ended"
)

// Why a process ended (Process.Reason).
const (
	// EndSandboxStopped: its sandbox stopped, expired or was deleted.
	EndSandboxStopped = "sandbox_stopped"
	// EndPodReplaced: its sandbox's pod was replaced.
	EndPodReplaced = "pod_replaced"
	// EndStateLost: its state in the sandbox vanished.
	EndStateLost = "state_lost"
	// EndStartFailed: its start failed.
	EndStartFailed = "start_failed"
)

// ProcessSignals are the signals a process may be sent, by name.
func ProcessSignals() []string {
	return []string{"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"}
}

// StartProcessRequest is the body of POST /v1/sandboxes/{id}/processes.
type StartProcessRequest struct {
	// Command is the argv; it is not run through a shell. It runs in the
	// image's working directory, as the image's user, with stdout and
	// stderr together as its output.
	Command []string `json:"command"`
	// Env is added to the image's environment for this process only; the
	// same rules as ExecRequest's Env.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the absolute directory it starts in ("" for the image's).
	Cwd string `json:"cwd,omitempty"`
}

// Process is a background process.
type Process struct {
	ID        string   `json:"id"`
	SandboxID string   `json:"sandbox_id"`
	Command   []string `json:"command"`
	// State is running, exited or ended.
	State string `json:"state"`
	// ExitCode is set once the process exited: its exit status, or 128
	// plus the signal's number when a signal killed it, as sh reports.
	ExitCode *int `json:"exit_code,omitempty"`
	// Reason says why an ended process ended.
	Reason    string     `json:"reason,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// OutputBytes is how many bytes of output the process has written in
	// all, as the sandbox said when this answer was made; absent when the
	// sandbox was not asked (not running, or the process had finished).
	OutputBytes *int64 `json:"output_bytes,omitempty"`
}

// ProcessList is a sandbox's processes, newest first.
type ProcessList struct {
	Items []Process `json:"items"`
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	// Signal is one of ProcessSignals.
	Signal string `json:"signal"`
}

// ValidSignal reports whether sig is one of ProcessSignals.
func ValidSignal(sig string) bool { return slices.Contains(ProcessSignals(), sig) }

func processPath(id, pid string, rest ...string) string {
	return sandboxPath(id, append([]string{"/processes/", url.PathEscape(pid)}, rest...)...)
}

// StartProcess starts a command detached in the sandbox and returns it
// running; it outlives the call. Unless c.NoWake, a sandbox stopped for
// idleness is woken first.
func (c *Client) StartProcess(ctx context.Context, id string, command []string) (Process, error) {
	return c.StartProcessWith(ctx, id, StartProcessRequest{Command: command})
}

// StartProcessWith is StartProcess with the request's Env and Cwd.
func (c *Client) StartProcessWith(ctx context.Context, id string, req StartProcessRequest) (Process, error) {
	if err := notUTF8(req.Command, req.Env, req.Cwd); err != nil {
		return Process{}, err
	}
	q := url.Values{}
	c.wake(q)
	p := sandboxPath(id, "/processes")
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var out Process
	err := c.do(ctx, request{method: http.MethodPost, path: p, in: req, once: true, timeout: -1}, &out)
	return out, err
}

// Processes lists a sandbox's processes, newest first.
func (c *Client) Processes(ctx context.Context, id string) ([]Process, error) {
	var out ProcessList
	err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/processes")}, &out)
	return out.Items, err
}

// Process gets one process, its state as the sandbox says it now when it
// can.
func (c *Client) Process(ctx context.Context, id, pid string) (Process, error) {
	var out Process
	err := c.do(ctx, request{method: http.MethodGet, path: processPath(id, pid)}, &out)
	return out, err
}

// KillProcess sends KILL to a running process (DELETE); it returns the
// process as it stood then. The exit shows in Process or WaitProcess.
func (c *Client) KillProcess(ctx context.Context, id, pid string) (Process, error) {
	var out Process
	err := c.do(ctx, request{method: http.MethodDelete, path: processPath(id, pid)}, &out)
	return out, err
}

// SignalProcess sends one of ProcessSignals to a running process's whole
// process group.
func (c *Client) SignalProcess(ctx context.Context, id, pid, signal string) (Process, error) {
	var out Process
	err := c.do(ctx, request{method: http.MethodPost, path: processPath(id, pid, "/signal"), in: SignalRequest{Signal: signal}}, &out)
	return out, err
}

// WriteStdin writes b (at most MaxProcessStdin bytes) to a running
// process's stdin; with close, its stdin is closed after, so it reads end
// of file. A write is sent once, never retried: it may have reached the
// process.
func (c *Client) WriteStdin(ctx context.Context, id, pid string, b []byte, close bool) error {
	p := processPath(id, pid, "/stdin")
	if close {
		p += "?close=true"
	}
	return c.do(ctx, request{method: http.MethodPost, path: p, header: http.Header{"Content-Type": {"application/octet-stream"}},
		body: bytes.NewReader(b), contentLength: int64(len(b)), once: true}, nil)
}

// ProcessOutput is a process's output from an offset, as it comes
// (Client.ProcessOutput). Offset is where the next byte read sits.
type ProcessOutput struct {
	// Offset is the offset of the next byte Read returns: where to
	// attach again after a cut.
	Offset int64
	body   io.ReadCloser
	cancel context.CancelFunc
}

// Read reads the output. io.EOF after a follow means the process's
// output is complete (it ended); any other error is a cut, after which
// the output may be read again from Offset.
func (o *ProcessOutput) Read(p []byte) (int, error) {
	n, err := o.body.Read(p)
	o.Offset += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("process output cut at offset %d: %w", o.Offset, err)
	}
	return n, err
}

// Close ends the reading.
func (o *ProcessOutput) Close() error {
	o.cancel()
	return o.body.Close()
}

// ProcessOutput reads a process's output (stdout and stderr together)
// from offset. Without follow it reads what is there now; with follow it
// reads on as the process writes, and ends (io.EOF) once the process
// ended and all of its output was read. An offset older than what the
// sandbox keeps is an *Error with code output_gone. The caller Closes it.
func (c *Client) ProcessOutput(ctx context.Context, id, pid string, offset int64, follow bool) (*ProcessOutput, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "true")
	}
	ctx, cancel := context.WithCancel(ctx)
	resp, err := c.send(ctx, request{method: http.MethodGet, path: processPath(id, pid, "/output?"+q.Encode()), timeout: -1})
	if err != nil {
		cancel()
		return nil, err
	}
	start, err := strconv.ParseInt(resp.Header.Get(OutputOffsetHeader), 10, 64)
	if err != nil || start < 0 {
		start = offset
	}
	return &ProcessOutput{Offset: start, body: resp.Body, cancel: cancel}, nil
}

// WaitProcess waits for a process to finish and returns it exited (with
// its exit code) or ended. It follows the process's output from where it
// stands, reading it without keeping it, and asks again after a cut.
func (c *Client) WaitProcess(ctx context.Context, id, pid string) (Process, error) {
	for {
		p, err := c.Process(ctx, id, pid)
		if err != nil || p.State != ProcessRunning {
			return p, err
		}
		var from int64
		if p.OutputBytes != nil {
			from = *p.OutputBytes
		}
		out, err := c.ProcessOutput(ctx, id, pid, from, true)
		switch {
		case ErrorCode(err) == CodeOutputGone || ErrorCode(err) == CodeProcessNotRunning:
		case err != nil:
			return Process{}, err
		default:
			_, err = io.Copy(io.Discard, bufio.NewReader(out))
			out.Close()
			if err == nil {
				continue // the process ended: ask how
			}
		}
		// A cut, or output that moved on: the process may have ended
		// with its sandbox; ask again in a moment.
		select {
		case <-ctx.Done():
			return Process{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
