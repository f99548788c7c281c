package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/k8s"

	"github.com/hiloop/hiloop/store"
)

// Client is a Go client of the API, used by the CLI.
type Client struct {
	URL   string
	Token string
	HTTP  *http.Client
	// InsecureHTTP allows a plain http:// URL to a host other than a
	// loopback one, over which the key would cross the network in clear
	// text; without it such a URL is refused before anything is sent.
	InsecureHTTP bool
}

// checkURL refuses a URL the key must not be sent to: another scheme than
// http or https, or plain http to a host that is not loopback (127.0.0.0/8,
// ::1, localhost) unless InsecureHTTP.
func (c *Client) checkURL() error {
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("API URL %q: %w", c.URL, err)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !c.InsecureHTTP && !isLoopback(u.Hostname()) {
			return fmt.Errorf("refusing to send the API key over plain http:// to %s, where anyone on the way can read it: use https://, or --insecure-http (HILOOP_INSECURE_HTTP=true) on a network you trust", u.Host)
		}
	default:
		return fmt.Errorf("API URL %q: want http:// or https://", c.URL)
	}
	return nil
}

// isLoopback reports whether host names this machine's loopback: localhost,
// or an address in 127.0.0.0/8 or ::1.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// APIError is an error response of the API.
type APIError struct {
	Status int
	ErrorDetail
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%s)", e.Message, e.Code)
}

func (c *Client) do(ctx context.Context, method, path string, header http.Header, in, out any) error {
	if err := c.checkURL(); err != nil {
		return err
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.URL, "/")+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
			return &APIError{Status: resp.StatusCode, ErrorDetail: ErrorDetail{Code: "http_" + fmt.Sprint(resp.StatusCode), Message: strings.TrimSpace(string(data))}}
		}
		return &APIError{Status: resp.StatusCode, ErrorDetail: eb.Error}
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	return json.Unmarshal(data, out)
}

// CreateSandbox creates a sandbox; idempotencyKey may be empty.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest, idempotencyKey string) (Sandbox, error) {
	var h http.Header
	if idempotencyKey != "" {
		h = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	var sb Sandbox
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes", h, req, &sb)
	return sb, err
}

// Sandbox gets one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
	return sb, err
}

// SandboxWhile gets a sandbox once its state is other than while, or after
// wait, whichever is first (the long poll of GET /v1/sandboxes/{id}).
func (c *Client) SandboxWhile(ctx context.Context, id string, while store.State, wait time.Duration) (Sandbox, error) {
	var sb Sandbox
	q := url.Values{"while": {string(while)}, "wait": {wait.String()}}
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"?"+q.Encode(), nil, nil, &sb)
	return sb, err
}

// ListSandboxes lists one page of sandboxes.
func (c *Client) ListSandboxes(ctx context.Context, state string, labels []string, limit int, after string) (SandboxList, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	for _, l := range labels {
		q.Add("label", l)
	}
	if limit > 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	if after != "" {
		q.Set("after", after)
	}
	var out SandboxList
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	err := c.do(ctx, http.MethodGet, path, nil, nil, &out)
	return out, err
}

// Action posts to stop or start.
func (c *Client) Action(ctx context.Context, id, action string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+action, nil, nil, &sb)
	return sb, err
}

// UpdateTTL sets a new TTL.
func (c *Client) UpdateTTL(ctx context.Context, id, ttl string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodPatch, "/v1/sandboxes/"+url.PathEscape(id), nil, UpdateSandboxRequest{TTL: ttl}, &sb)
	return sb, err
}

// DeleteSandbox deletes a sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
	return sb, err
}

// Events lists a sandbox's state transitions.
func (c *Client) Events(ctx context.Context, id string) ([]store.Event, error) {
	var out EventList
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/events", nil, nil, &out)
	return out.Items, err
}

// Org returns the caller's organization.
func (c *Client) Org(ctx context.Context) (store.Org, error) {
	var o store.Org
	err := c.do(ctx, http.MethodGet, "/v1/org", nil, nil, &o)
	return o, err
}

// Keys lists the caller's organization's keys.
func (c *Client) Keys(ctx context.Context) ([]store.APIKey, error) {
	var out KeyList
	err := c.do(ctx, http.MethodGet, "/v1/keys", nil, nil, &out)
	return out.Items, err
}

// CreateKey issues a key in the caller's organization.
func (c *Client) CreateKey(ctx context.Context, name string) (CreatedKey, error) {
	var out CreatedKey
	err := c.do(ctx, http.MethodPost, "/v1/keys", nil, CreateKeyRequest{Name: name}, &out)
	return out, err
}

// RevokeKey revokes a key of the caller's organization.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(id), nil, nil, nil)
}

// failedWaiting reports whether waiting for a state stops, failed, once a
// sandbox is in state st.
func failedWaiting(st store.State) bool {
	switch st {
	case store.StateExited, store.StateExpired, store.StateDeleted, store.StateLost,
		store.StateAttention, store.StateQuarantined, store.StateFailed:
		return true
	}
	return false
}

// Wait polls a sandbox until it reaches state want, calling progress on each
// change of state. It returns the sandbox and an error when a failure state
// (or, waiting for running, a stop) ends the wait first.
func (c *Client) Wait(ctx context.Context, id string, want store.State, progress func(Sandbox)) (Sandbox, error) {
	var last store.State
	sb, err := c.Sandbox(ctx, id)
	for {
		if err != nil {
			if ctx.Err() != nil && last != "" {
				return sb, fmt.Errorf("timed out waiting for %s; sandbox is %s", want, last)
			}
			return sb, err
		}
		if sb.State != last {
			last = sb.State
			if progress != nil {
				progress(sb)
			}
		}
		if sb.State == want {
			return sb, nil
		}
		if failedWaiting(sb.State) || (want == store.StateRunning && sb.Desired != store.ModeRunning) {
			return sb, &WaitError{Sandbox: sb}
		}
		// The server answers when the state changes. An answer in the same
		// state before the wait is up (the server is shutting down, or the
		// key has too many long polls waiting) is followed by a pause, not
		// at once by the next call.
		asked := time.Now()
		next, nerr := c.SandboxWhile(ctx, id, sb.State, waitPoll)
		if nerr == nil && next.State == sb.State && time.Since(asked) < waitPoll {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		if nerr == nil {
			sb = next
		}
		err = nerr
	}
}

// waitPoll is how long each of Wait's calls waits at most.
const waitPoll = 30 * time.Second

// WaitError reports that a wait ended in a failure state.
type WaitError struct{ Sandbox Sandbox }

func (e *WaitError) Error() string {
	sb := e.Sandbox
	msg := "sandbox " + sb.ID + " is " + string(sb.State)
	if sb.Anomaly != "" {
		msg += " (" + sb.Anomaly + ")"
	}
	if sb.ExitCode != nil {
		msg += fmt.Sprintf(", exit code %d", *sb.ExitCode)
	}
	if sb.Reason != "" {
		msg += ": " + sb.Reason
	}
	return msg
}

// StreamOptions describe a streaming exec session.
type StreamOptions struct {
	Command []string
	Stdin   io.Reader // nil: no stdin
	Stdout  io.Writer
	Stderr  io.Writer
	TTY     bool
	Resize  <-chan ResizeFrame
	Timeout time.Duration
}

// ErrNoExitFrame reports a session that ended without an exit frame: the
// connection was lost, so the command's fate is unknown.
var ErrNoExitFrame = errors.New("exec session ended without an exit frame")

// ExecStream runs a command over the streaming endpoint and returns its
// exit frame. An error frame is returned as an *APIError.
func (c *Client) ExecStream(ctx context.Context, id string, o StreamOptions) (ExitFrame, error) {
	if err := c.checkURL(); err != nil {
		return ExitFrame{}, err
	}
	u, err := url.Parse(strings.TrimRight(c.URL, "/") + "/v1/sandboxes/" + url.PathEscape(id) + "/exec")
	if err != nil {
		return ExitFrame{}, err
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	// The argv goes in the first message, not the URL, so it stays out of
	// proxy and access logs.
	q := url.Values{}
	if o.Stdin != nil {
		q.Set("stdin", "true")
	}
	if o.TTY {
		q.Set("tty", "true")
	}
	if o.Timeout > 0 {
		q.Set("timeout", o.Timeout.String())
	}
	u.RawQuery = q.Encode()
	d := websocket.Dialer{Subprotocols: []string{ExecSubprotocol}, HandshakeTimeout: 30 * time.Second,
		ReadBufferSize: 256 << 10, WriteBufferSize: 32 << 10}
	conn, resp, err := d.DialContext(ctx, u.String(), http.Header{"Authorization": {"Bearer " + c.Token}})
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			var eb ErrorBody
			if json.Unmarshal(data, &eb) == nil && eb.Error.Code != "" {
				return ExitFrame{}, &APIError{Status: resp.StatusCode, ErrorDetail: eb.Error}
			}
		}
		return ExitFrame{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	start, err := json.Marshal(StartFrame{Command: o.Command})
	if err != nil {
		return ExitFrame{}, err
	}
	if err := conn.WriteMessage(websocket.TextMessage, start); err != nil {
		return ExitFrame{}, fmt.Errorf("exec: send command: %w", err)
	}
	send := k8s.NewChannelConn(conn).Send
	if o.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := o.Stdin.Read(buf)
				if n > 0 && send(ChanStdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					send(ChanCloseIn, []byte{ChanStdin})
					return
				}
			}
		}()
	}
	if o.Resize != nil {
		go func() {
			for f := range o.Resize {
				b, _ := json.Marshal(f)
				if send(ChanResize, b) != nil {
					return
				}
			}
		}()
	}
	buf := make([]byte, 256<<10)
	for {
		mt, r, err := conn.NextReader()
		if err != nil {
			if ctx.Err() != nil {
				return ExitFrame{}, ctx.Err()
			}
			return ExitFrame{}, ErrNoExitFrame
		}
		var ch [1]byte
		if mt != websocket.BinaryMessage {
			continue
		}
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			continue
		}
		switch ch[0] {
		case ChanStdout, ChanStderr:
			w := o.Stdout
			if ch[0] == ChanStderr {
				w = o.Stderr
			}
			if w == nil {
				w = io.Discard
			}
			if _, err := io.CopyBuffer(w, r, buf); err != nil {
				return ExitFrame{}, err
			}
		case ChanExit:
			var f ExitFrame
			if err := json.NewDecoder(r).Decode(&f); err != nil {
				return ExitFrame{}, fmt.Errorf("unreadable exit frame: %w", err)
			}
			if f.Error != nil {
				return f, &APIError{Status: 0, ErrorDetail: *f.Error}
			}
			return f, nil
		}
	}
}

// AddSSHKey registers an SSH public key for the caller's organization.
func (c *Client) AddSSHKey(ctx context.Context, req AddSSHKeyRequest) (store.SSHKey, error) {
	var k store.SSHKey
	err := c.do(ctx, http.MethodPost, "/v1/ssh-keys", nil, req, &k)
	return k, err
}

// SSHKeys lists the organization's SSH keys.
func (c *Client) SSHKeys(ctx context.Context) ([]store.SSHKey, error) {
	var l SSHKeyList
	err := c.do(ctx, http.MethodGet, "/v1/ssh-keys", nil, nil, &l)
	return l.Items, err
}

// DeleteSSHKey removes an SSH key.
func (c *Client) DeleteSSHKey(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/ssh-keys/"+url.PathEscape(id), nil, nil, nil)
}

// HostKey returns the SSH gateway's host key and port.
func (c *Client) HostKey(ctx context.Context) (HostKey, error) {
	var hk HostKey
	err := c.do(ctx, http.MethodGet, "/v1/ssh/host-key", nil, nil, &hk)
	return hk, err
}
