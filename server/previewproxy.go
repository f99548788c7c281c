package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// A preview's visitor is a stranger until proven otherwise: the host names
// the preview, and its token (query, cookie or bearer) or an API key of its
// organization (bearer) must match it, or the answer is 404, the same for
// every reason. The connection's header and body deadlines and header caps
// are the listener's (httpLimits in main); a refusal costs the client
// address's rate-limit bucket; every request is admitted by the core as a
// forward session (the session limits, the wake of an idle sandbox, the use
// that keeps it awake), held to the preview, so a revoke or an expiry ends
// the connections open through it.

// maxPreviewResponseHeaderBytes bounds the headers a sandbox's app may
// answer with.
const maxPreviewResponseHeaderBytes = 256 << 10

// hostName is host (a request's Host, maybe with a port) as a lower-case
// name without the port and without the trailing dot of a fully qualified
// name, which names the same host.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// isPreviewHost reports whether host (a request's Host, maybe with a port)
// is a host of the preview domain.
func (s *Server) isPreviewHost(host string) bool {
	d := s.previewDomain()
	return d != "" && strings.HasSuffix(hostName(host), "."+d)
}

// previewID is the preview id a preview host names, or "".
func (s *Server) previewID(host string) string {
	label, ok := strings.CutSuffix(hostName(host), "."+s.previewDomain())
	if !ok {
		return ""
	}
	rest, ok := strings.CutPrefix(label, previewHostPrefix)
	if !ok || rest == "" || strings.ContainsAny(rest, ".-_") {
		return ""
	}
	return "pv_" + rest
}

// visitor is who a preview request comes from, with the credential it
// presented and how.
type visitor struct {
	who     control.Caller
	preview store.Preview
	// fromQuery: the token came in the query, and the answer sets the
	// cookie.
	fromQuery bool
	token     string
}

// servePreview proxies a request on a preview host to its sandbox's port.
func (s *Server) servePreview(w http.ResponseWriter, r *http.Request) {
	lim, addr := s.o.RateLimits, clientAddress(r)
	ok, no, refund := s.limiters.takeAddress(lim, addr)
	if !ok {
		s.rateLimited(w, r, no)
		return
	}
	v, err := s.previewVisitor(r)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, control.ErrUnauthenticated) {
			err = errNoPreview
		}
		s.writeError(w, r, err)
		return
	}
	refund()
	info(r).org = v.who.OrgID
	// A preview's visits are held to a key's rate of their own
	// (--rate-limit), and count toward the organization's: each costs a
	// pod lookup and a connection to the sandbox's helper.
	bucket := "preview:" + v.preview.ID
	found, ok, no := s.limiters.allowKey(lim, bucket, false)
	if !found {
		s.limiters.addKey(lim, bucket, v.who.OrgID)
		_, ok, no = s.limiters.allowKey(lim, bucket, false)
	}
	if !ok {
		s.rateLimited(w, r, no)
		return
	}
	if v.fromQuery {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			http.SetCookie(w, s.previewCookie(v))
			// The token leaves the address bar, the history and the
			// Referer: the cookie carries it from now on.
			u := *r.URL
			q := u.Query()
			q.Del(previewTokenParam)
			u.RawQuery = q.Encode()
			u.Scheme, u.Host = "", ""
			http.Redirect(w, r, sameHostPath(u.RequestURI()), http.StatusSeeOther)
			return
		}
	}
	sess, done, err := s.admitPreview(r.Context(), v)
	if err != nil {
		s.writeError(w, r, previewRefusal(err))
		return
	}
	defer sess.End()
	defer done()
	conn, err := s.o.Previews.Dial(sess, v.preview.Port)
	if err != nil {
		s.writeError(w, r, unreachable(v.preview.Port, err))
		return
	}
	counted := &countedConn{Conn: conn}
	defer func() {
		conn.Close()
		sess.Moved(counted.in.Load(), counted.out.Load())
	}()
	s.proxy(w, r.WithContext(sess.Context()), v, counted)
}

// countedConn counts the bytes written into the sandbox (in) and read out
// of it (out), for the session's metrics.
type countedConn struct {
	net.Conn
	in, out atomic.Int64
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.out.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.in.Add(int64(n))
	return n, err
}

// previewVisitor finds the preview the request's host names and the
// visitor its credential makes: an API key in Authorization (a preview of
// key auth), or the preview's token in the query, in Authorization or in a
// cookie.
func (s *Server) previewVisitor(r *http.Request) (visitor, error) {
	id := s.previewID(r.Host)
	if id == "" {
		return visitor{}, store.ErrNotFound
	}
	ctx := r.Context()
	// A bearer that is neither an API key nor a preview token is the
	// app's own, and passes to it untouched.
	bearer := hiloopBearer(r.Header)
	if len(bearer) > maxSecretLen {
		bearer = ""
	}
	if store.IsKeySecret(bearer) {
		who, err := s.o.Control.Authenticate(ctx, control.Credential{Secret: bearer})
		if err != nil {
			return visitor{}, err
		}
		c, p, err := s.o.Control.PreviewVisitor(ctx, id, control.PreviewCredential{Key: &who})
		return visitor{who: c, preview: p}, err
	}
	// The token in the query is tried on its own: when it is the one, the
	// answer sets the cookie.
	if q := r.URL.Query().Get(previewTokenParam); q != "" && len(q) <= maxSecretLen {
		c, p, err := s.o.Control.PreviewVisitor(ctx, id, control.PreviewCredential{Token: q})
		if err == nil {
			return visitor{who: c, preview: p, token: q, fromQuery: true}, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return visitor{}, err
		}
	}
	// The bearer and every cookie of the name are tried in one lookup.
	tries := []string{}
	if bearer != "" {
		tries = append(tries, bearer)
	}
	for _, c := range r.CookiesNamed(previewCookie) {
		if len(tries) == store.MaxPreviewTokens {
			break
		}
		if len(c.Value) <= maxSecretLen && store.IsPreviewToken(c.Value) {
			tries = append(tries, c.Value)
		}
	}
	if len(tries) == 0 {
		return visitor{}, store.ErrNotFound
	}
	c, p, err := s.o.Control.PreviewVisitor(ctx, id, control.PreviewCredential{Tokens: tries})
	return visitor{who: c, preview: p}, err
}

// admitPreview admits the visit as a forward session of its sandbox and
// counts it as one use until done, waking a sandbox stopped for idleness
// as ssh -L does (control.UseWaking).
func (s *Server) admitPreview(ctx context.Context, v visitor) (*control.Session, func(), error) {
	wo := control.WakeOptions{Transport: receipt.TransportForward, Trigger: "preview"}
	var sess *control.Session
	var done func()
	err := s.o.Control.UseWaking(ctx, v.who, v.preview.SandboxID, wo, func() (bool, error) {
		ss, err := s.o.Control.Admit(ctx, v.who, v.preview.SandboxID, receipt.TransportForward)
		if err != nil {
			var se *control.StateError
			return errors.As(err, &se), err
		}
		d, err := ss.Use()
		if err != nil {
			ss.End()
			return true, err
		}
		sess, done = ss, d
		return false, nil
	})
	return sess, done, err
}

// previewRefusal is what a visitor is told of a refused admission: a
// preview revoked or expired in between is not found, as before.
func previewRefusal(err error) error {
	switch {
	case errors.Is(err, control.ErrUnauthenticated), errors.Is(err, store.ErrNotFound):
		return errNoPreview
	}
	return err
}

// unreachable is the answer when the sandbox's port could not be reached.
func unreachable(port int, err error) error {
	msg := err.Error()
	var oe *forward.OpenError
	if errors.As(err, &oe) {
		msg = fmt.Sprintf("nothing answered on port %d in the sandbox: %s", port, oe.Message)
	}
	return newError(http.StatusBadGateway, api.CodePreviewUnreachable, msg)
}

// proxy sends the request to the sandbox's port over conn and the answer
// back, a protocol switch (WebSocket) included; the request's context is
// the session's, so the session's end cuts both.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, v visitor, conn net.Conn) {
	dialled := false
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "127.0.0.1:" + strconv.Itoa(v.preview.Port)
			pr.Out.Host = r.Host
			stripPreviewCredentials(pr.Out)
			pr.Out.Header.Set("X-Forwarded-Host", r.Host)
			pr.Out.Header.Set("X-Forwarded-Proto", s.o.Previews.Scheme)
		},
		Transport: &http.Transport{
			DialContext: func(context.Context, string, string) (net.Conn, error) {
				if dialled {
					return nil, errors.New("the preview's stream was used")
				}
				dialled = true
				return conn, nil
			},
			DisableKeepAlives:      true,
			DisableCompression:     true,
			MaxResponseHeaderBytes: maxPreviewResponseHeaderBytes,
		},
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			appCookies(res.Header)
			if v.fromQuery {
				// Set on the final answer: an informational one before it
				// takes the writer's headers with it.
				res.Header.Add("Set-Cookie", s.previewCookie(v).String())
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			s.log.Debug("preview proxy", "preview", v.preview.ID, "err", err)
			s.writeError(w, r, newError(http.StatusBadGateway, api.CodePreviewUnreachable, "the sandbox's app did not answer with HTTP"))
		},
	}
	rp.ServeHTTP(informational{w}, r)
}

// previewCookie is the cookie that carries v's token from now on.
func (s *Server) previewCookie(v visitor) *http.Cookie {
	return &http.Cookie{Name: previewCookie, Value: v.token, Path: "/", HttpOnly: true,
		Secure: s.o.Previews.Scheme == "https", SameSite: http.SameSiteLaxMode, Expires: v.preview.ExpiresAt}
}

// informational passes an app's informational answers (103 Early Hints)
// on without any Set-Cookie: the proxy copies their headers as they come,
// past the filter of the final answer's.
type informational struct{ http.ResponseWriter }

func (w informational) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.Header().Del("Set-Cookie")
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the writer's flush and hijack.
func (w informational) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sameHostPath is path as a Location that stays on the request's host: a
// path of "//x" would be read as the host x.
func sameHostPath(path string) string {
	if strings.HasPrefix(path, "//") {
		return "/." + path
	}
	return path
}

// stripPreviewCredentials takes hiloop's own credentials out of a request
// bound for a sandbox: the token parameter, a bearer API key or preview
// token, and the preview cookie.
func stripPreviewCredentials(r *http.Request) {
	q := r.URL.Query()
	if q.Has(previewTokenParam) {
		q.Del(previewTokenParam)
		r.URL.RawQuery = q.Encode()
	}
	auth := r.Header.Values("Authorization")
	r.Header.Del("Authorization")
	for _, a := range auth {
		if !hiloopCredential(a) {
			r.Header.Add("Authorization", a)
		}
	}
	if ref := r.Header.Get("Referer"); strings.Contains(ref, previewTokenParam) {
		r.Header.Set("Referer", refererWithoutToken(ref))
		if r.Header.Get("Referer") == "" {
			r.Header.Del("Referer")
		}
	}
	lines := r.Header.Values("Cookie")
	r.Header.Del("Cookie")
	for _, line := range lines {
		kept := []string{}
		for _, part := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(part), "=")
			if name != previewCookie {
				kept = append(kept, strings.TrimSpace(part))
			}
		}
		if len(kept) > 0 {
			r.Header.Add("Cookie", strings.Join(kept, "; "))
		}
	}
}

// refererWithoutToken is ref, the URL of the page a request comes from,
// without the token parameter: a page reached by a POST with the token in
// its query keeps it in the address bar, and the browser sends that URL as
// the Referer of the page's own requests. "" when ref is not a URL.
func refererWithoutToken(ref string) string {
	u, err := url.Parse(ref)
	if err != nil {
		return ""
	}
	q := u.Query()
	q.Del(previewTokenParam)
	u.RawQuery, u.Fragment, u.RawFragment = q.Encode(), "", ""
	if s := u.String(); !strings.Contains(s, previewTokenParam) {
		return s
	}
	return ""
}

// hiloopCredential reports whether the Authorization value a holds an API
// key or a preview token in the Bearer scheme, however spelt: the scheme's
// case, and the blanks around the credential, do not matter.
func hiloopCredential(a string) bool {
	scheme, cred, _ := strings.Cut(strings.TrimSpace(a), " ")
	if s2, c2, ok := strings.Cut(scheme, "\t"); ok {
		scheme, cred = s2, c2+" "+cred
	}
	cred = strings.TrimSpace(cred)
	return strings.EqualFold(scheme, "bearer") && (store.IsKeySecret(cred) || store.IsPreviewToken(cred))
}

// hiloopBearer is the bearer credential of h when it is hiloop's (an API
// key or a preview token, hiloopCredential), else "".
func hiloopBearer(h http.Header) string {
	a := h.Get("Authorization")
	if !hiloopCredential(a) {
		return ""
	}
	_, cred, _ := strings.Cut(strings.Join(strings.Fields(a), " "), " ")
	return cred
}

// appCookies keeps what a sandbox's app answers to set a cookie to the
// app's own preview host: a Set-Cookie a browser would take as hiloop's
// cookie (read as a browser does, whether Go parses it or not) is dropped,
// and a Domain attribute is taken out, so no app sets a cookie that other
// preview hosts of the domain receive (another organization's app would
// read it, or find it shadowing its own).
func appCookies(h http.Header) {
	all := h.Values("Set-Cookie")
	if len(all) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, sc := range all {
		parts := strings.Split(sc, ";")
		name, _, _ := strings.Cut(parts[0], "=")
		if strings.EqualFold(strings.TrimSpace(name), previewCookie) {
			continue
		}
		kept := parts[:1]
		for _, attr := range parts[1:] {
			k, _, _ := strings.Cut(attr, "=")
			if !strings.EqualFold(strings.TrimSpace(k), "domain") {
				kept = append(kept, attr)
			}
		}
		h.Add("Set-Cookie", strings.Join(kept, ";"))
	}
}
