package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

// Client calls the hiloop API. Its zero value is not usable: set URL and
// Token, or use NewClient.
type Client struct {
	URL   string
	Token string
	// HTTP makes the requests; http.DefaultClient's transport when nil.
	// Calls end with their context: give HTTP no Timeout, which would cut
	// file transfers and long commands.
	HTTP *http.Client
	// InsecureHTTP allows a plain http:// URL to a host other than a
	// loopback one, over which the key would cross the network in clear
	// text; without it such a URL is refused before anything is sent.
	InsecureHTTP bool
	// MaxRetries bounds how often a request answered 429 or 503 with a
	// Retry-After is tried again, after waiting as asked; 4 when zero, none
	// when negative.
	MaxRetries int
	// NoWake stops Run, Exec and the file calls from waking a sandbox
	// stopped for idleness: by default they ask the server to start it
	// and wait for it (?wake=true, up to the server's wake timeout), as
	// if it had been running; with NoWake such a sandbox is an *Error
	// with code sandbox_not_running. A sandbox its owner stopped is never
	// woken.
	NoWake bool
}

// wakeWait is how much longer than its own time a call that may wake a
// sandbox waits: serve's --wake-timeout, by default.
const wakeWait = 2 * time.Minute

// wake adds ?wake=true to q unless c.NoWake, and says whether it did.
func (c *Client) wake(q url.Values) bool {
	if c.NoWake {
		return false
	}
	q.Set("wake", "true")
	return true
}

// NewClient returns a client of the API at url with the key token; an
// empty url or token is taken from HILOOP_URL or HILOOP_TOKEN, and the URL
// is http://127.0.0.1:8080 (hiloop dev's) when neither says.
func NewClient(url, token string) *Client {
	if url == "" {
		url = os.Getenv("HILOOP_URL")
	}
	if url == "" {
		url = "http://127.0.0.1:8080"
	}
	if token == "" {
		token = os.Getenv("HILOOP_TOKEN")
	}
	return &Client{URL: url, Token: token}
}

// callTimeout bounds a JSON call whose context has no deadline of its own:
// every call but a one-shot command answers well within it (the long poll
// waits at most a minute).
const callTimeout = 2 * time.Minute

// maxRetryWait caps one wait between retries, whatever Retry-After asks.
const maxRetryWait = time.Minute

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

// httpClient is c.HTTP, or http.DefaultClient, following no redirect: the
// API never redirects, and Go's client would send the key on to the same
// host over plain http://, or to any of its subdomains, past checkURL.
func (c *Client) httpClient() *http.Client {
	hc := *http.DefaultClient
	if c.HTTP != nil {
		hc = *c.HTTP
	}
	hc.CheckRedirect = refuseRedirect
	return &hc
}

func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("the API answered with a redirect to %s, which hiloop's API never sends; point the client at the API itself (HILOOP_URL)", req.URL.Redacted())
}

// request is one call of the API.
type request struct {
	method, path string
	header       http.Header
	// body is sent as is; in is marshalled to JSON when body is nil.
	body          io.Reader
	contentLength int64
	in            any
	// rewind, when set, gives body anew for a retry.
	rewind func() (io.Reader, error)
	// timeout replaces callTimeout; negative: none but ctx's.
	timeout time.Duration
	// once: the body cannot be sent again, so a refusal is not retried.
	once bool
}

// send makes the request, retrying a 429 or 503 that carries Retry-After,
// and returns the response of a status below 400; an error status comes
// back as an *Error. The caller closes the body.
func (c *Client) send(ctx context.Context, rq request) (*http.Response, error) {
	if err := c.checkURL(); err != nil {
		return nil, err
	}
	var payload []byte
	if rq.body == nil && rq.in != nil {
		b, err := json.Marshal(rq.in)
		if err != nil {
			return nil, err
		}
		payload = b
	}
	for attempt := 0; ; attempt++ {
		body, length := rq.body, rq.contentLength
		if attempt > 0 && rq.rewind != nil {
			var err error
			if body, err = rq.rewind(); err != nil {
				return nil, err
			}
		}
		if payload != nil {
			body, length = bytes.NewReader(payload), int64(len(payload))
		}
		req, err := http.NewRequestWithContext(ctx, rq.method, strings.TrimRight(c.URL, "/")+rq.path, body)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.ContentLength = length
		}
		if payload != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range rq.header {
			req.Header[k] = v
		}
		if c.Token != "" {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		}
		resp, err := c.httpClient().Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode < 400 {
			return resp, nil
		}
		apiErr := readError(resp)
		resp.Body.Close()
		if rq.once || !c.retry(ctx, attempt, apiErr) {
			return nil, apiErr
		}
	}
}

// retry reports whether to try a refused request again, after waiting as
// its Retry-After asks: only a 429 or 503 that asks is tried again, at most
// MaxRetries times, and never past ctx.
func (c *Client) retry(ctx context.Context, attempt int, e *Error) bool {
	retries := c.MaxRetries
	if retries == 0 {
		retries = 4
	}
	if attempt >= retries || e.RetryAfter == 0 {
		return false
	}
	t := time.NewTimer(min(e.RetryAfter, maxRetryWait))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// readError reads an error answer into an *Error.
func readError(resp *http.Response) *Error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{Status: resp.StatusCode}
	var eb ErrorBody
	if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
		e.ErrorDetail = ErrorDetail{Code: "http_" + strconv.Itoa(resp.StatusCode), Message: strings.TrimSpace(string(data))}
	} else {
		e.ErrorDetail = eb.Error
	}
	if e.RequestID == "" {
		e.RequestID = resp.Header.Get("X-Request-Id")
	}
	if (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) && resp.Header.Get("Retry-After") != "" {
		e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
	}
	return e
}

// parseRetryAfter reads Retry-After in seconds or as an HTTP date; a
// Retry-After of 0 still waits a little, so a retry is never immediate.
func parseRetryAfter(v string) time.Duration {
	const least = 100 * time.Millisecond
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return max(time.Duration(s)*time.Second, least)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), least)
	}
	return time.Second
}

// do makes a JSON call and decodes the answer into out.
func (c *Client) do(ctx context.Context, rq request, out any) error {
	timeout := rq.timeout
	if timeout == 0 {
		timeout = callTimeout
	}
	if _, ok := ctx.Deadline(); !ok && timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, err := c.send(ctx, rq)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	return json.Unmarshal(data, out)
}

func sandboxPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

// CreateSandbox creates a sandbox. Every try of the call carries the same
// Idempotency-Key (idempotencyKey, or a random one when empty), so however
// often a refusal is retried it makes one sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest, idempotencyKey string) (Sandbox, error) {
	if err := notUTF8(nil, req.Env, ""); err != nil {
		return Sandbox{}, err
	}
	if idempotencyKey == "" {
		idempotencyKey = NewIdempotencyKey()
	}
	var sb Sandbox
	err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sandboxes",
		header: http.Header{"Idempotency-Key": {idempotencyKey}}, in: req}, &sb)
	return sb, err
}

// Sandbox gets one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id)}, &sb)
	return sb, err
}

// SandboxWhile gets a sandbox once its state is other than while, or after
// wait, whichever is first (the long poll of GET /v1/sandboxes/{id}).
func (c *Client) SandboxWhile(ctx context.Context, id string, while State, wait time.Duration) (Sandbox, error) {
	var sb Sandbox
	q := url.Values{"while": {string(while)}, "wait": {wait.String()}}
	err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id) + "?" + q.Encode()}, &sb)
	return sb, err
}

// ListOptions filter and page a list of sandboxes.
type ListOptions struct {
	// State keeps only sandboxes in this state.
	State State
	// Labels keeps only sandboxes with every one of these labels.
	Labels map[string]string
	// Limit is the page size; the server's default (100) when 0.
	Limit int
	// After is the previous page's Next.
	After string
}

// ListSandboxes lists one page of sandboxes.
func (c *Client) ListSandboxes(ctx context.Context, o ListOptions) (SandboxList, error) {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", string(o.State))
	}
	for k, v := range o.Labels {
		q.Add("label", k+"="+v)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.After != "" {
		q.Set("after", o.After)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out SandboxList
	err := c.do(ctx, request{method: http.MethodGet, path: path}, &out)
	return out, err
}

// Sandboxes iterates over every sandbox that o selects, page by page from
// o.After on; it stops at the first error, which it yields.
func (c *Client) Sandboxes(ctx context.Context, o ListOptions) iter.Seq2[Sandbox, error] {
	return func(yield func(Sandbox, error) bool) {
		for {
			page, err := c.ListSandboxes(ctx, o)
			if err != nil {
				yield(Sandbox{}, err)
				return
			}
			for _, sb := range page.Items {
				if !yield(sb, nil) {
					return
				}
			}
			if page.Next == "" {
				return
			}
			o.After = page.Next
		}
	}
}

// StopSandbox stops a sandbox: its volumes survive, its processes do not.
func (c *Client) StopSandbox(ctx context.Context, id string) (Sandbox, error) {
	return c.action(ctx, http.MethodPost, sandboxPath(id, "/stop"))
}

// StartSandbox starts a stopped sandbox.
func (c *Client) StartSandbox(ctx context.Context, id string) (Sandbox, error) {
	return c.action(ctx, http.MethodPost, sandboxPath(id, "/start"))
}

// DeleteSandbox deletes a sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, id string) (Sandbox, error) {
	return c.action(ctx, http.MethodDelete, sandboxPath(id))
}

func (c *Client) action(ctx context.Context, method, path string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, request{method: method, path: path}, &sb)
	return sb, err
}

// UpdateTTL sets a sandbox's expiry to now plus ttl (a Go duration).
func (c *Client) UpdateTTL(ctx context.Context, id, ttl string) (Sandbox, error) {
	return c.UpdateSandbox(ctx, id, UpdateSandboxRequest{TTL: ttl})
}

// UpdateSandbox changes what req sets of a sandbox: its TTL, its idle
// timeout.
func (c *Client) UpdateSandbox(ctx context.Context, id string, req UpdateSandboxRequest) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, request{method: http.MethodPatch, path: sandboxPath(id), in: req}, &sb)
	return sb, err
}

// TouchSandbox counts a use of a sandbox now, so its idle clock starts
// again.
func (c *Client) TouchSandbox(ctx context.Context, id string) (Sandbox, error) {
	return c.action(ctx, http.MethodPost, sandboxPath(id, "/touch"))
}

// CreatePreview serves a port of a sandbox at a URL on the deployment's
// preview domain (Preview.URL). A token preview's URL carries its token,
// shown only in this answer. It is not retried: a second try would make a
// second preview.
func (c *Client) CreatePreview(ctx context.Context, id string, req CreatePreviewRequest) (Preview, error) {
	var out Preview
	err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/previews"), in: req, once: true}, &out)
	return out, err
}

// Previews lists a sandbox's live previews, oldest first, without tokens.
func (c *Client) Previews(ctx context.Context, id string) ([]Preview, error) {
	var out PreviewList
	err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/previews")}, &out)
	return out.Items, err
}

// RevokePreview revokes a sandbox's preview: its URL stops working at the
// next request, and connections open through it end.
func (c *Client) RevokePreview(ctx context.Context, id, previewID string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id, "/previews/"+url.PathEscape(previewID))}, nil)
}

// Events lists a sandbox's state transitions, oldest first.
func (c *Client) Events(ctx context.Context, id string) ([]Event, error) {
	var out EventList
	err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/events")}, &out)
	return out.Items, err
}

// Org returns the caller's organization.
func (c *Client) Org(ctx context.Context) (Org, error) {
	var o Org
	err := c.do(ctx, request{method: http.MethodGet, path: "/v1/org"}, &o)
	return o, err
}

// Keys lists the caller's organization's keys.
func (c *Client) Keys(ctx context.Context) ([]APIKey, error) {
	var out KeyList
	err := c.do(ctx, request{method: http.MethodGet, path: "/v1/keys"}, &out)
	return out.Items, err
}

// CreateKey issues a key in the caller's organization.
func (c *Client) CreateKey(ctx context.Context, name string) (CreatedKey, error) {
	var out CreatedKey
	err := c.do(ctx, request{method: http.MethodPost, path: "/v1/keys", in: CreateKeyRequest{Name: name}, once: true}, &out)
	return out, err
}

// RevokeKey revokes a key of the caller's organization.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/keys/" + url.PathEscape(id)}, nil)
}

// AddSSHKey registers an SSH public key for the caller's organization.
func (c *Client) AddSSHKey(ctx context.Context, req AddSSHKeyRequest) (SSHKey, error) {
	var k SSHKey
	err := c.do(ctx, request{method: http.MethodPost, path: "/v1/ssh-keys", in: req}, &k)
	return k, err
}

// SSHKeys lists the organization's SSH keys.
func (c *Client) SSHKeys(ctx context.Context) ([]SSHKey, error) {
	var l SSHKeyList
	err := c.do(ctx, request{method: http.MethodGet, path: "/v1/ssh-keys"}, &l)
	return l.Items, err
}

// DeleteSSHKey removes an SSH key.
func (c *Client) DeleteSSHKey(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/ssh-keys/" + url.PathEscape(id)}, nil)
}

// HostKey returns the SSH gateway's host key and port.
func (c *Client) HostKey(ctx context.Context) (HostKey, error) {
	var hk HostKey
	err := c.do(ctx, request{method: http.MethodGet, path: "/v1/ssh/host-key"}, &hk)
	return hk, err
}

// failedWaiting reports whether waiting for a state stops, failed, once a
// sandbox is in state st.
func failedWaiting(st State) bool {
	switch st {
	case StateExited, StateExpired, StateDeleted, StateLost,
		StateAttention, StateQuarantined, StateFailed:
		return true
	}
	return false
}

// Wait waits until a sandbox reaches state want, following the long poll,
// and returns it. A failure state (or, waiting for running, a stop) ends
// the wait first with a *WaitError; ctx bounds it.
func (c *Client) Wait(ctx context.Context, id string, want State) (Sandbox, error) {
	return c.WaitProgress(ctx, id, want, nil)
}

// WaitProgress is Wait calling progress on each change of state.
func (c *Client) WaitProgress(ctx context.Context, id string, want State, progress func(Sandbox)) (Sandbox, error) {
	var last State
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
		if failedWaiting(sb.State) || (want == StateRunning && sb.Desired != ModeRunning) {
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

// Run runs a one-shot command (POST .../exec/run) and returns how it ended
// and what it printed, each of stdout and stderr up to MaxRunOutput bytes.
// A command that ran past its timeout answers TimedOut, not an error. A
// command line, Env or Cwd that is not UTF-8 is refused as the server
// refuses it (an *Error, 400), before anything is sent; Exec does the same.
func (c *Client) Run(ctx context.Context, id string, req ExecRunRequest) (ExecRunResponse, error) {
	if err := notUTF8(req.Command, req.Env, req.Cwd); err != nil {
		return ExecRunResponse{}, err
	}
	timeout := DefaultExecTimeout
	if req.Timeout != "" {
		if d, err := time.ParseDuration(req.Timeout); err == nil {
			timeout = d
		}
	}
	path := sandboxPath(id, "/exec/run")
	if q := (url.Values{}); c.wake(q) {
		path += "?" + q.Encode()
		timeout += wakeWait
	}
	var out ExecRunResponse
	if err := c.do(ctx, request{method: http.MethodPost, path: path, in: req,
		timeout: timeout + callTimeout}, &out); err != nil {
		return out, err
	}
	return out, out.decodeOutput()
}

// ExecOptions describe a streaming exec session.
type ExecOptions struct {
	// Command is the argv; it is not run through a shell.
	Command []string
	// Stdin is copied to the command, then closed; nil gives it no stdin.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// TTY allocates a terminal (Stdin is then required).
	TTY    bool
	Resize <-chan ResizeFrame
	// Timeout kills the command after this long; the server's maximum when 0.
	Timeout time.Duration
	// Env is added to the command's environment and Cwd is the directory
	// it runs in, as in ExecRunRequest.
	Env map[string]string
	Cwd string
}

// ExitStatus is how a command ended: its exit code, and the signal that
// killed it when the runtime said so (Code is then 128 + its number).
type ExitStatus struct {
	Code   int
	Signal string
}

// ErrNoExitFrame reports a session that ended without an exit frame: the
// connection was lost, so the command's fate is unknown.
var ErrNoExitFrame = errors.New("exec session ended without an exit frame")

// Exec runs a command over the streaming endpoint, copying its output to
// o.Stdout and o.Stderr as it comes, and returns its exit status. A command
// past its timeout, and any refusal, is an *Error (code exec_timeout for
// the former); a stream lost before the exit frame is ErrNoExitFrame.
func (c *Client) Exec(ctx context.Context, id string, o ExecOptions) (ExitStatus, error) {
	f, err := c.execStream(ctx, id, o)
	if err != nil {
		return ExitStatus{}, err
	}
	if f.ExitCode == nil {
		return ExitStatus{}, errors.New("exec: the exit frame carried neither an exit code nor an error")
	}
	return ExitStatus{Code: *f.ExitCode, Signal: f.Signal}, nil
}

func (c *Client) execStream(ctx context.Context, id string, o ExecOptions) (ExitFrame, error) {
	u, d, err := c.execDial(id, o)
	if err != nil {
		return ExitFrame{}, err
	}
	conn, err := c.dial(ctx, d, u)
	if err != nil {
		return ExitFrame{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	start, err := json.Marshal(StartFrame{Command: o.Command, Env: o.Env, Cwd: o.Cwd})
	if err != nil {
		return ExitFrame{}, err
	}
	if err := conn.WriteMessage(websocket.TextMessage, start); err != nil {
		return ExitFrame{}, fmt.Errorf("exec: send command: %w", err)
	}
	sendInput(NewChannelConn(conn).Send, o)
	return readExit(ctx, conn, o)
}

// execDial is the streaming endpoint's URL for o and the dialer for it.
func (c *Client) execDial(id string, o ExecOptions) (string, websocket.Dialer, error) {
	if err := c.checkURL(); err != nil {
		return "", websocket.Dialer{}, err
	}
	if err := notUTF8(o.Command, o.Env, o.Cwd); err != nil {
		return "", websocket.Dialer{}, err
	}
	u, err := url.Parse(strings.TrimRight(c.URL, "/") + sandboxPath(id, "/exec"))
	if err != nil {
		return "", websocket.Dialer{}, err
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
	handshake := 30 * time.Second
	if c.wake(q) {
		// The server answers the handshake once the sandbox runs: up to
		// its wake timeout later.
		handshake += wakeWait
	}
	u.RawQuery = q.Encode()
	d := websocket.Dialer{Subprotocols: []string{ExecSubprotocol}, HandshakeTimeout: handshake,
		ReadBufferSize: 256 << 10, WriteBufferSize: 32 << 10}
	if c.HTTP != nil {
		if t, ok := c.HTTP.Transport.(*http.Transport); ok {
			d.TLSClientConfig = t.TLSClientConfig
			d.Proxy = t.Proxy
		}
	}
	return u.String(), d, nil
}

// sendInput sends o.Stdin, then its end, and o.Resize's sizes, each from a
// goroutine of its own that ends with its source or the connection.
func sendInput(send func(byte, []byte) error, o ExecOptions) {
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
}

// readExit copies the stream's output to o.Stdout and o.Stderr until its
// exit frame, which it returns.
func readExit(ctx context.Context, conn *websocket.Conn, o ExecOptions) (ExitFrame, error) {
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
			// writerOnly hides an *os.File's ReadFrom, which would leave
			// buf unused and copy each message through a 32 KiB buffer of
			// its own, allocated anew per message, which the CLI would
			// spend much of its CPU allocating and collecting
			// (docs/benchmarks.md, exec throughput).
			if _, err := io.CopyBuffer(writerOnly{w}, r, buf); err != nil {
				return ExitFrame{}, err
			}
		case ChanExit:
			var f ExitFrame
			if err := json.NewDecoder(r).Decode(&f); err != nil {
				return ExitFrame{}, fmt.Errorf("unreadable exit frame: %w", err)
			}
			if f.Error != nil {
				return f, &Error{ErrorDetail: *f.Error}
			}
			return f, nil
		}
	}
}

// writerOnly is an io.Writer and nothing else, so io.CopyBuffer uses the
// buffer it is given.
type writerOnly struct{ io.Writer }

// dial opens the exec stream's WebSocket, retrying a refusal of the
// handshake that carries Retry-After as send does: nothing ran yet.
func (c *Client) dial(ctx context.Context, d websocket.Dialer, u string) (*websocket.Conn, error) {
	for attempt := 0; ; attempt++ {
		conn, resp, err := d.DialContext(ctx, u, http.Header{"Authorization": {"Bearer " + c.Token}})
		if err == nil {
			return conn, nil
		}
		if resp == nil || resp.StatusCode < 400 {
			return nil, err
		}
		apiErr := readError(resp)
		resp.Body.Close()
		if !c.retry(ctx, attempt, apiErr) {
			return nil, apiErr
		}
	}
}
