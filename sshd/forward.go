package sshd

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/receipt"
)

// upstream is the one connection to a sandbox's session helper that a
// client connection's -L channels share, each channel a stream of its mux.
// It lives as long as the client connection and its forward session (a
// revoke, a stop or shutdown ends it).
type upstream struct {
	// dialled is closed once the dial ended, with mux and sess, or err,
	// set.
	dialled chan struct{}
	mux     *forward.Mux
	// sess is the forward session the upstream belongs to.
	sess *control.Session
	err  error
}

// directTCPIP handles -L: the destination must be loopback inside the
// sandbox with a port in 1..65535, the sandbox must have the forward
// transport, and every channel goes over the client connection's one
// upstream connection to the helper. A sandbox stopped for idleness is
// woken first, the channel's open waiting for it; an open channel counts as
// use of the sandbox.
func (g *Gateway) directTCPIP(_ *ssh.Server, conn *gossh.ServerConn, nc gossh.NewChannel, ctx ssh.Context) {
	who, ok := caller(conn)
	if !ok {
		nc.Reject(gossh.Prohibited, "not authenticated")
		return
	}
	l, ok := g.open(ctx, nc, false)
	if !ok {
		return
	}
	defer l.leave(false)
	var p forward.DirectTCPIP
	if err := gossh.Unmarshal(nc.ExtraData(), &p); err != nil {
		nc.Reject(gossh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	log := g.log.With("sandbox", conn.User(), "org", who.OrgID, "key", who.KeyID)
	if reason := forward.Loopback(p.Host, p.Port); reason != "" {
		log.Info("ssh forward refused", "host", p.Host, "port", p.Port)
		nc.Reject(gossh.Prohibited, reason)
		return
	}
	req, err := forward.EncodeOpen(p.Host, p.Port)
	if err != nil {
		nc.Reject(gossh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	up, done, ok := g.upstreamInUse(ctx, nc, conn, who, log)
	if !ok {
		return
	}
	defer done()
	// The helper answers an open within its own dial timeout; one that
	// does not (a tenant's program on the helper's port) holds the
	// channel only until HelperDialTimeout.
	octx, cancel := context.WithTimeout(ctx, g.o.HelperDialTimeout)
	st, err := up.mux.Open(octx.Done(), req)
	late := octx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		var oe *forward.OpenError
		switch {
		case errors.As(err, &oe):
			nc.Reject(gossh.RejectionReason(oe.Reason), oe.Message)
		case late:
			nc.Reject(gossh.ConnectionFailed, "the sandbox's session helper did not answer")
		default:
			nc.Reject(gossh.ConnectionFailed, "the sandbox's session helper went away")
		}
		return
	}
	cch, creqs, err := nc.Accept()
	if err != nil {
		st.Close()
		return
	}
	go gossh.DiscardRequests(creqs)
	up.sess.Moved(forward.Pipe(cch, st))
}

// upstreamInUse wakes the connection's sandbox if it was stopped for
// idleness and returns the connection's upstream with one use of the
// sandbox counted until done. An idle stop that lands in between is woken
// from again (control.UseWaking). It rejects nc and reports false when it
// cannot.
func (g *Gateway) upstreamInUse(ctx ssh.Context, nc gossh.NewChannel, conn *gossh.ServerConn, who control.Caller, log *slog.Logger) (*upstream, func(), bool) {
	wo := control.WakeOptions{Transport: receipt.TransportForward}
	if err := g.o.Control.Wake(ctx, who, conn.User(), wo); err != nil {
		rejectWake(nc, conn, err)
		return nil, nil, false
	}
	var up *upstream
	var done func()
	err := g.o.Control.UseWaking(ctx, who, conn.User(), wo, func() (bool, error) {
		var err error
		if up, err = g.upstream(ctx, conn, who, log); err != nil {
			return false, &rejection{gossh.ConnectionFailed, err.Error()}
		}
		if done, err = up.sess.Use(); err != nil {
			// The upstream's session is being ended by an idle stop:
			// forget it, so the next try dials the woken sandbox's helper.
			g.upstreams.CompareAndDelete(conn, up)
			return true, &rejection{gossh.Prohibited, refusal(conn.User(), err)}
		}
		return false, nil
	})
	var rj *rejection
	switch {
	case errors.As(err, &rj):
		nc.Reject(rj.reason, rj.message)
		return nil, nil, false
	case err != nil:
		rejectWake(nc, conn, err)
		return nil, nil, false
	}
	return up, done, true
}

// rejection is a channel refused with its reason and message.
type rejection struct {
	reason  gossh.RejectionReason
	message string
}

func (r *rejection) Error() string { return r.message }

// rejectWake refuses a channel whose sandbox could not be woken.
func rejectWake(nc gossh.NewChannel, conn *gossh.ServerConn, err error) {
	reason := gossh.Prohibited
	if errors.Is(err, control.ErrTooManyWaits) {
		reason = gossh.ResourceShortage
	}
	nc.Reject(reason, refusal(conn.User(), err))
}

// upstream is the connection's upstream, dialled once for all its -L
// channels: the first channel dials, the others wait for that dial, each
// only while the connection lives. A failed dial is forgotten, so a later
// channel dials again.
func (g *Gateway) upstream(ctx ssh.Context, conn *gossh.ServerConn, who control.Caller, log *slog.Logger) (*upstream, error) {
	up := &upstream{dialled: make(chan struct{})}
	if v, loaded := g.upstreams.LoadOrStore(conn, up); loaded {
		up = v.(*upstream)
		select {
		case <-up.dialled:
			return up, up.err
		case <-ctx.Done():
			return nil, errors.New("the connection closed")
		}
	}
	up.mux, up.sess, up.err = g.dialHelper(ctx, conn, who, log, up)
	if up.err != nil {
		g.upstreams.CompareAndDelete(conn, up)
	}
	close(up.dialled)
	return up, up.err
}

// dialHelper admits a forward session for the connection and dials the
// sandbox's helper for up, pinning its key to the pod. The session and the
// upstream end together, with the client connection or when control ends
// the session.
func (g *Gateway) dialHelper(ctx ssh.Context, conn *gossh.ServerConn, who control.Caller, log *slog.Logger, up *upstream) (*forward.Mux, *control.Session, error) {
	sess, err := g.o.Control.Admit(ctx, who, conn.User(), receipt.TransportForward)
	if err != nil {
		return nil, nil, errors.New(refusal(conn.User(), err))
	}
	mux, podUID, err := g.helperMux(sess, log, g.o.MaxChannelsPerConn)
	if err != nil {
		sess.End()
		return nil, nil, err
	}
	log.Info("forward session opened", "pod_uid", podUID)
	// Whichever ends first, the client's connection or the session, ends
	// the other and the upstream; but a session ended by an idle stop
	// leaves the client's connection open, so that its next -L channel
	// wakes the sandbox. An upstream whose helper went away ends its
	// session and is forgotten, so the next channel dials again.
	go func() {
		select {
		case <-ctx.Done():
		case <-mux.Done():
			log.Info("forward upstream ended", "err", mux.Err())
		case <-sess.Context().Done():
			if !errors.Is(sess.Ended(), control.ErrIdleStopped) {
				conn.Close()
			}
		}
		mux.Close()
		sess.End()
		g.upstreams.CompareAndDelete(conn, up)
	}()
	return mux, sess, nil
}

// helperMux dials the session's sandbox's helper, pinning its key to the
// pod, and starts a mux of at most maxStreams streams on the connection,
// which ends when the session does (its context). The error says what a
// client may be told; the cause is logged.
func (g *Gateway) helperMux(sess *control.Session, log *slog.Logger, maxStreams int) (*forward.Mux, string, error) {
	ctx := sess.Context()
	fail := func(msg string, err error) (*forward.Mux, string, error) {
		g.log.Warn(msg, "sandbox", sess.SandboxID, "err", err)
		return nil, "", errors.New(msg)
	}
	addr, podUID, err := g.o.Control.HelperAddr(ctx, sess)
	if err != nil {
		msg := "the sandbox's session helper has no address yet"
		if errors.Is(err, control.ErrPodNotServing) {
			msg = err.Error()
		}
		return fail(msg, err)
	}
	// The server name is the sandbox id and the keys are derived for this
	// sandbox alone: a helper of any other sandbox refuses them.
	keys, err := g.o.Control.GatewayKeys(ctx, sess)
	if err != nil {
		return fail("the gateway's key is unreadable", err)
	}
	tc, err := g.dialTLS(ctx, addr, sess.SandboxID, keys, g.pinned(sess, podUID))
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			// The client left, or control ended the session: nobody
			// waits for the helper any more.
			log.Debug("forward dial abandoned", "cause", cause)
			return nil, "", fmt.Errorf("the session ended: %w", cause)
		}
		switch {
		case errors.Is(err, forward.ErrOldHelper):
			return fail(forward.ErrOldHelper.Error(), err)
		case errors.Is(err, forward.ErrRefused):
			return fail("the sandbox's session helper refused the gateway", err)
		case errors.Is(err, context.DeadlineExceeded):
			g.o.Metrics.SSHRefused(refusedHelperDial)
		}
		return fail("the sandbox's session helper did not answer", err)
	}
	// A helper takes in what the gateway writes at once (its reader never
	// waits); one that does not within HelperDialTimeout stopped reading,
	// and its upstream ends rather than hold every channel behind it.
	return forward.NewMux(tc, forward.MuxOptions{MaxStreams: maxStreams, WriteTimeout: g.o.HelperDialTimeout}), podUID, nil
}

// dialTLS connects to the helper at addr and completes the TLS handshake,
// through the helper's ready, with the first of keys it accepts (the
// sandbox's key from the current gateway key, then from the one it
// replaced), all within HelperDialTimeout; it gives up at once when ctx
// ends. A helper that refuses one key is dialled again with the next. pin
// checks the helper's key within the same time.
func (g *Gateway) dialTLS(ctx context.Context, addr, sandboxID string, keys []ed25519.PrivateKey, pin func(context.Context, ed25519.PublicKey) error) (*forward.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, g.o.HelperDialTimeout)
	defer cancel()
	err := forward.ErrRefused
	for _, key := range keys {
		var cfg *tls.Config
		cfg, err = forward.ClientConfig(sandboxID, key, func(k ed25519.PublicKey) error { return pin(ctx, k) })
		if err != nil {
			return nil, err
		}
		var nc net.Conn
		nc, err = dialRefused(ctx, addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		// Closing the connection is what ends a handshake in progress.
		stop := context.AfterFunc(ctx, func() { nc.Close() })
		var tc *forward.Conn
		tc, err = forward.Handshake(nc, cfg)
		if !stop() {
			// ctx ended: the handshake failed on the closed connection, or
			// finished just before it was closed.
			if err == nil {
				tc.Close()
			}
			return nil, ctx.Err()
		}
		if err == nil {
			return tc, nil
		}
		nc.Close()
		if !errors.Is(err, forward.ErrRefused) {
			return nil, err
		}
	}
	return nil, err
}

// dialRefused dials addr, and again while it is refused, until ctx ends:
// the helper of a pod that just came up (a woken sandbox) may not listen
// yet, and nothing but its listening says when it does.
func dialRefused(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	wait := 50 * time.Millisecond
	for {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return nc, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// pinned holds a pod's helper to the first key it showed the gateway, for
// the rest of the pod's life: a new pod may have a new key, one pod may not
// change it. The record keeps the pin (store.PinHelperKey), so it holds
// across restarts of hiloop; the gateway keeps what it learnt in memory, so
// only a pod's first dial (and the first refusal of a changed key) writes.
// The memory's lock covers the map alone: a write waits without holding up
// any other dial.
func (g *Gateway) pinned(sess *control.Session, podUID string) func(context.Context, ed25519.PublicKey) error {
	return func(ctx context.Context, key ed25519.PublicKey) error {
		fp := forward.Fingerprint(key)
		pinned, known := g.pins.check(podUID, fp)
		if !known {
			g.log.Debug("checking the session helper's host key against the record", "sandbox", sess.SandboxID, "pod_uid", podUID)
			var (
				reported bool
				err      error
			)
			if pinned, reported, err = g.pinInRecord(ctx, sess, podUID, fp); err != nil {
				// Whatever the record holds, the next dial asks it again.
				g.pins.forget(podUID)
				g.log.Error("pin the session helper's host key", "sandbox", sess.SandboxID, "pod_uid", podUID, "err", err)
				return errors.New("the helper's host key could not be checked")
			}
			g.pins.learn(podUID, pinned, reported)
		}
		if pinned == fp {
			return nil
		}
		if !known {
			g.log.Error("session helper host key changed within one pod's life; refusing it", "sandbox", sess.SandboxID, "pod_uid", podUID, "pinned", pinned, "shown", fp)
		}
		return fmt.Errorf("helper host key changed within the pod's life (%s, pinned %s)", fp, pinned)
	}
}

// pinInRecord asks the record for the pod's pin (control.PinHelperKey),
// one question per pod and key at a time: a dial that finds its question
// asked waits for that answer. The question has HelperDialTimeout to be
// answered; the dial waits for it until its own ctx ends (the dial's
// deadline, or its client left). The question runs on after its dial, so
// a changed key is recorded even if its client left. reported says the
// answer refused fp, and so recorded the change.
func (g *Gateway) pinInRecord(ctx context.Context, sess *control.Session, podUID, fp string) (pinned string, reported bool, err error) {
	a, first := g.pins.ask(podUID, fp)
	if first {
		go func() {
			qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.o.HelperDialTimeout)
			defer cancel()
			pinned, err := g.o.Control.PinHelperKey(qctx, sess, podUID, fp)
			g.pins.answered(a, pinned, err)
		}()
	}
	select {
	case <-a.done:
		return a.pinned, a.err == nil && a.pinned != fp, a.err
	case <-ctx.Done():
		return "", false, context.Cause(ctx)
	}
}

// pins is what the gateway learnt of the record's helper pins: for each pod
// uid, the fingerprint pinned and whether a refusal of another was
// recorded. The record is the authority, so the map is dropped whole once
// it holds maxPins pods.
type pins struct {
	mu sync.Mutex
	m  map[string]pin
	// asked are the questions to the record under way, one per pod and
	// key: a dial of another key never takes the answer to a question it
	// did not ask.
	asked map[question]*answer
}

// question is a pod and the key (fingerprint) its pin is asked with.
type question struct{ pod, fp string }

// answer is the record's answer to a question; done is closed once pinned
// and err hold it.
type answer struct {
	q      question
	done   chan struct{}
	pinned string
	err    error
}

// ask returns the answer awaited for podUID and fp, or a new one, which
// first says the caller must ask.
func (p *pins) ask(podUID, fp string) (a *answer, first bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := question{podUID, fp}
	if a := p.asked[q]; a != nil {
		return a, false
	}
	if p.asked == nil {
		p.asked = map[question]*answer{}
	}
	a = &answer{q: q, done: make(chan struct{})}
	p.asked[q] = a
	return a, true
}

// answered gives a its answer.
func (p *pins) answered(a *answer, pinned string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a.pinned, a.err = pinned, err
	delete(p.asked, a.q)
	close(a.done)
}

// pin is what is known of one pod's pin: its fingerprint, and whether a
// refusal of another key was recorded (or is being, by the dial that
// claimed it).
type pin struct {
	fingerprint string
	reported    bool
}

// maxPins bounds the pods whose pins the gateway keeps in memory.
const maxPins = 4096

// check says whether fp is the fingerprint known to be pinned for podUID.
// known is false when the record must say: no pin of the pod is known, or
// another key shows and this is the first refusal of it (which claims the
// report, so that other dials refuse without writing).
func (p *pins) check(podUID, fp string) (pinned string, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.m[podUID]
	switch {
	case !ok:
		return "", false
	case e.fingerprint == fp || e.reported:
		return e.fingerprint, true
	}
	e.reported = true
	p.m[podUID] = e
	return e.fingerprint, false
}

// forget drops what is known of podUID's pin.
func (p *pins) forget(podUID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, podUID)
}

// learn keeps the record's pin of podUID, and whether a refusal of another
// key was recorded.
func (p *pins) learn(podUID, fingerprint string, reported bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil || len(p.m) >= maxPins {
		p.m = map[string]pin{}
	}
	e := p.m[podUID]
	p.m[podUID] = pin{fingerprint: fingerprint, reported: reported || e.reported && e.fingerprint == fingerprint}
}
