// Package server is hiloop's HTTP API. It only translates: every read is
// answered from the product record, and everything a caller may do to a
// sandbox, a key or a session is asked of the core (package control), whose
// answers and errors it maps to HTTP in one place.
package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/metrics"
)

// MaxBodyBytes caps every request body.
const MaxBodyBytes = 64 << 10

// Options configure New.
type Options struct {
	// Control authenticates every request, answers every read, and does
	// everything a caller may do to a sandbox.
	Control *control.Control
	Log     *slog.Logger
	// Ready reports whether the server may take traffic (cluster checked,
	// mirror synced); /readyz answers 503 until it returns nil, and gives it
	// ReadyTimeout to answer.
	Ready func(ctx context.Context) error
	// ReadyTimeout bounds /readyz; 2s when zero.
	ReadyTimeout time.Duration
	// HostKey and SSHPort describe the SSH gateway, when it runs.
	HostKey gossh.PublicKey
	SSHPort int
	// RateLimits bound each API key; off when zero.
	RateLimits RateLimits
	// Metrics records requests and authentication failures; optional.
	Metrics *metrics.Metrics
	// MaxFileBytes caps one file upload or download;
	// api.DefaultMaxFileBytes when zero.
	MaxFileBytes int64
	// Previews serves preview URLs; off when its Domain is empty.
	Previews Previews
}

// Server is the HTTP API. Its handlers only translate: HTTP in, a call to
// control, HTTP out.
type Server struct {
	o        Options
	log      *slog.Logger
	mux      *http.ServeMux
	handler  http.Handler
	limiters limiters
	// held bounds the refusals held back at once (see rateLimited).
	held chan struct{}
	// ready runs /readyz's checks one at a time.
	ready readiness
}

// New builds the API.
func New(o Options) (*Server, error) {
	if o.Control == nil {
		return nil, errors.New("server: control is required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Ready == nil {
		o.Ready = func(context.Context) error { return nil }
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 2 * time.Second
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = api.DefaultMaxFileBytes
	}
	if o.Previews.Domain != "" && (o.Previews.Dial == nil || o.Previews.Scheme == "") {
		return nil, errors.New("server: previews need a dialer and a scheme")
	}
	s := &Server{o: o, log: o.Log.With("component", "api"), mux: http.NewServeMux(), held: make(chan struct{}, maxHeld)}
	for _, rt := range s.routes() {
		h := rt.handler
		switch rt.access {
		case keyed:
			h = s.authenticated(rt, h)
		case anyone:
			h = s.anonymous(h)
		}
		pattern := rt.pattern
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			info(r).route = pattern
			h(w, r)
		})
	}
	s.handler = s.logged(http.HandlerFunc(s.serve))
	return s, nil
}

// route is one entry of the API, with what the middleware holds its
// requests to. Routes lists them for the OpenAPI test.
type route struct {
	pattern string
	access  access
	// load is what a request holds beyond its key's rate (keyed routes).
	load    load
	handler http.HandlerFunc
}

// access says who may call a route.
type access int

const (
	// keyed: an API key (authenticated), limited per key and organization.
	keyed access = iota
	// anyone, limited per client address (anonymous).
	anyone
	// probe: the kubelet's probes, which no address limit holds: the
	// kubelet can share an address with anyone behind the same NAT, and a
	// flood there must not fail them (a failed liveness probe restarts
	// hiloop). /healthz costs nothing, and /readyz runs one check at a time
	// (see readiness).
	probe
)

// load is what a keyed request holds while it runs, beyond a token of its
// key's and organization's rate (see slots).
type load int

const (
	// write: nothing more.
	write load = iota
	// read: a GET, which waits its turn for one of the key's read slots.
	read
	// create: a token of the key's and organization's create rate too.
	create
	// poll: a read that, with ?while=STATE, is a long poll and holds one
	// of the key's and organization's waiting slots instead.
	poll
	// session: an exec stream, a file transfer or a file operation's GET,
	// which the session limits hold, not a read slot.
	session
)

func (s *Server) routes() []route {
	return []route{
		{"GET /healthz", probe, write, s.healthz},
		{"GET /readyz", probe, write, s.readyz},
		{"GET /v1/openapi.json", anyone, write, s.openapi},
		{"GET /v1/org", keyed, read, s.getOrg},
		{"GET /v1/keys", keyed, read, s.listKeys},
		{"POST /v1/keys", keyed, write, s.createKey},
		{"DELETE /v1/keys/{id}", keyed, write, s.revokeKey},
		{"GET /v1/ssh-keys", keyed, read, s.listSSHKeys},
		{"POST /v1/ssh-keys", keyed, write, s.addSSHKey},
		{"DELETE /v1/ssh-keys/{id}", keyed, write, s.deleteSSHKey},
		{"GET /v1/ssh/host-key", keyed, read, s.hostKey},
		{"POST /v1/sandboxes", keyed, create, s.createSandbox},
		{"GET /v1/sandboxes", keyed, read, s.listSandboxes},
		{"GET /v1/sandboxes/{id}", keyed, poll, s.getSandbox},
		{"PATCH /v1/sandboxes/{id}", keyed, write, s.updateSandbox},
		{"DELETE /v1/sandboxes/{id}", keyed, write, s.deleteSandbox},
		{"POST /v1/sandboxes/{id}/stop", keyed, write, s.stopSandbox},
		{"POST /v1/sandboxes/{id}/start", keyed, write, s.startSandbox},
		{"POST /v1/sandboxes/{id}/touch", keyed, write, s.touchSandbox},
		{"GET /v1/sandboxes/{id}/events", keyed, read, s.sandboxEvents},
		{"GET /v1/sandboxes/{id}/exec", keyed, session, s.execStream},
		{"POST /v1/sandboxes/{id}/exec/run", keyed, write, s.execRun},
		{"PUT /v1/sandboxes/{id}/files", keyed, session, s.putFile},
		{"GET /v1/sandboxes/{id}/files", keyed, session, s.getFile},
		{"POST /v1/sandboxes/{id}/processes", keyed, write, s.startProcess},
		{"GET /v1/sandboxes/{id}/processes", keyed, read, s.listProcesses},
		{"GET /v1/sandboxes/{id}/processes/{pid}", keyed, read, s.getProcess},
		{"DELETE /v1/sandboxes/{id}/processes/{pid}", keyed, write, s.killProcess},
		{"GET /v1/sandboxes/{id}/processes/{pid}/output", keyed, session, s.processOutput},
		{"POST /v1/sandboxes/{id}/processes/{pid}/stdin", keyed, write, s.writeStdin},
		{"POST /v1/sandboxes/{id}/processes/{pid}/signal", keyed, write, s.signalProcess},
		{"GET /v1/sandboxes/{id}/fs/list", keyed, session, s.fsList},
		{"GET /v1/sandboxes/{id}/fs/stat", keyed, session, s.fsStat},
		{"POST /v1/sandboxes/{id}/fs/remove", keyed, write, s.fsRemove},
		{"POST /v1/sandboxes/{id}/fs/mkdir", keyed, write, s.fsMkdir},
		{"POST /v1/sandboxes/{id}/fs/rename", keyed, write, s.fsRename},
		{"POST /v1/sandboxes/{id}/previews", keyed, write, s.createPreview},
		{"GET /v1/sandboxes/{id}/previews", keyed, read, s.listPreviews},
		{"DELETE /v1/sandboxes/{id}/previews/{pid}", keyed, write, s.revokePreview},
	}
}

// Routes lists the method and path of every route, as in the OpenAPI
// document ("GET /v1/sandboxes/{id}").
func (s *Server) Routes() []string {
	var out []string
	for _, rt := range s.routes() {
		out = append(out, rt.pattern)
	}
	return out
}

// ServeHTTP serves the API with request ids and the access log.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// serve serves the API, recovering a panic into a 500 and answering unknown
// paths and methods with the JSON envelope.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("panic", "method", r.Method, "route", info(r).route, "request_id", info(r).id, "panic", v, "stack", string(debug.Stack()))
			writeJSON(w, http.StatusInternalServerError, api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeInternal, Message: "internal error", RequestID: info(r).id}})
		}
	}()
	if s.isPreviewHost(r.Host) {
		info(r).route = "preview"
		s.servePreview(w, r)
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.noRoute(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// noRoute tells an unknown path (404) from a known path with another method (405).
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, p := s.mux.Handler(probe); p != "" {
			s.writeError(w, r, newError(http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
			return
		}
	}
	s.writeError(w, r, newError(http.StatusNotFound, api.CodeNotFound, "no such route "+r.URL.Path))
}

type ctxKey struct{}

// maxSecretLen is well above the length of any key hiloop makes (46
// bytes): a longer bearer token, up to the server's header limit, is
// refused before it is hashed.
const maxSecretLen = 128

// anonymous limits a route that needs no key, but the probes, per client
// address: it is open to anyone.
func (s *Server) anonymous(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if ok, no := s.limiters.allowAddress(s.o.RateLimits, clientAddress(r)); !ok {
			s.rateLimited(w, r, no)
			return
		}
		next(w, r)
	}
}

// authenticated resolves the bearer key and puts the key that actually
// authenticated into the request context; handlers authorize against it.
//
// Rate limits come first, so a flood's excess costs no record lookup. A key
// that has authenticated before has buckets, its own and its
// organization's, keyed by the presented secret's hash, and takes a token
// of each. A token that has none (a made-up one, or a real key's first
// request) takes a token of its client address's bucket before the lookup,
// given back if it authenticates, and gets buckets only once it has: made-up
// tokens never get a key's buckets, so they can neither crowd a real key's
// out nor spend anyone's budget but their address's.
func (s *Server) authenticated(rt route, next http.HandlerFunc) http.HandlerFunc {
	creating := rt.load == create
	return func(w http.ResponseWriter, r *http.Request) {
		lim, addr, refund := s.o.RateLimits, clientAddress(r), func() {}
		h := r.Header.Get("Authorization")
		secret, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || secret == "" {
			if ok, no := s.limiters.allowAddress(lim, addr); !ok {
				s.rateLimited(w, r, no)
				return
			}
			s.unauthorized(w, r, true)
			return
		}
		if len(secret) > maxSecretLen {
			// Never a key: refused without hashing it, as a made-up
			// token, against its address.
			if ok, no := s.limiters.allowAddress(lim, addr); !ok {
				s.rateLimited(w, r, no)
				return
			}
			s.unauthorized(w, r, false)
			return
		}
		sum := sha256.Sum256([]byte(secret))
		keyHash := hex.EncodeToString(sum[:16])
		found, ok, no := s.limiters.allowKey(lim, keyHash, creating)
		switch {
		case found && !ok:
			s.rateLimited(w, r, no)
			return
		case found:
			release, ok := s.slots(r, rt, keyHash)
			if !ok {
				return // the client went away while waiting its turn
			}
			defer release()
		default:
			var no refusal
			if ok, no, refund = s.limiters.takeAddress(lim, addr); !ok {
				s.rateLimited(w, r, no)
				return
			}
		}
		who, err := s.o.Control.Authenticate(r.Context(), control.Credential{Secret: secret})
		if err != nil {
			if !errors.Is(err, control.ErrUnauthenticated) {
				s.writeError(w, r, err)
				return
			}
			// Revoked, or never a key: it has no buckets from now on,
			// and its address pays for the lookup.
			if found {
				s.limiters.forget(keyHash)
				s.limiters.chargeAddress(lim, addr)
			}
			s.unauthorized(w, r, false)
			return
		}
		if !found {
			refund()
			s.limiters.addKey(lim, keyHash, who.OrgID)
			if _, ok, no := s.limiters.allowKey(lim, keyHash, creating); !ok {
				s.rateLimited(w, r, no)
				return
			}
			release, ok := s.slots(r, rt, keyHash)
			if !ok {
				return
			}
			defer release()
		}
		info(r).org = who.OrgID
		next(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, who)))
	}
}

// unauthorized answers 401 to a request without a bearer token (missing),
// or with one that is no live key.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, missing bool) {
	if missing {
		w.Header().Set("WWW-Authenticate", `Bearer realm="hiloop"`)
		s.o.Metrics.AuthFailure("api_key_missing")
		s.writeError(w, r, newError(http.StatusUnauthorized, api.CodeUnauthorized, "missing bearer token"))
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="hiloop", error="invalid_token"`)
	s.o.Metrics.AuthFailure("api_key_invalid")
	s.writeError(w, r, newError(http.StatusUnauthorized, api.CodeUnauthorized, "invalid or revoked key"))
}

// slots takes what a request of the key holds while it runs: a long poll
// one of the key's and its organization's waiting slots if they are free
// (and answers at once otherwise), any other GET but an exec stream or a
// download (sessions, which the session limits hold) one of
// their read slots, waiting its turn. ok is false when the client went
// away while waiting.
func (s *Server) slots(r *http.Request, rt route, keyHash string) (release func(), ok bool) {
	switch {
	case rt.load == poll && r.URL.Query().Has("while"):
		release, ok := s.limiters.wait(keyHash)
		info(r).noWait = !ok
		return release, true
	case rt.load == read || rt.load == poll:
		release, err := s.limiters.read(r.Context(), keyHash)
		return release, err == nil
	}
	return func() {}, true
}

// caller is the organization and key that authenticated the request.
func caller(r *http.Request) control.Caller {
	return r.Context().Value(ctxKey{}).(control.Caller)
}

// decode reads a JSON body of at most MaxBodyBytes into v, refusing unknown
// fields and trailing data.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeLimit(w, r, v, MaxBodyBytes)
}

// decodeLimit is decode with another size cap.
func decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return newError(http.StatusUnsupportedMediaType, api.CodeUnsupportedMediaType, "Content-Type must be application/json")
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return newError(http.StatusRequestEntityTooLarge, api.CodeBodyTooLarge, fmt.Sprintf("body exceeds %d bytes", limit))
		}
		return newError(http.StatusBadRequest, api.CodeInvalidJSON, "could not read body")
	}
	if err := jsonUTF8(body); err != nil {
		return newError(http.StatusBadRequest, api.CodeInvalidJSON, err.Error())
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return newError(http.StatusBadRequest, api.CodeInvalidJSON, "body holds more than one JSON value")
	}
	return nil
}

// knownQuery refuses a query parameter other than those named.
func knownQuery(q url.Values, known ...string) error {
	for k := range q {
		if !slices.Contains(known, k) {
			return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeUnknownField, Field: k, Message: "unknown query parameter " + k}}
		}
	}
	return nil
}

// errEmptyBody answers a request whose JSON body is empty; action endpoints
// accept it.
var errEmptyBody = newError(http.StatusBadRequest, api.CodeInvalidJSON, "empty body")

// emptyBody accepts an absent, empty or {} body on action endpoints.
func emptyBody(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength == 0 {
		return nil
	}
	var v struct{}
	if err := decode(w, r, &v); err != errEmptyBody {
		return err
	}
	return nil
}

// jsonError maps a JSON decoding error to the answer that names the field.
func jsonError(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		f := te.Field
		if f == "" {
			f = "body"
		}
		return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidField, Field: f,
			Message: fmt.Sprintf("%s: expected %s, got JSON %s", f, te.Type, te.Value)}}
	case errors.As(err, &se):
		return newError(http.StatusBadRequest, api.CodeInvalidJSON, fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, err))
	case errors.Is(err, io.EOF):
		return errEmptyBody
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeUnknownField, Field: f, Message: "unknown field " + f}}
	default:
		return newError(http.StatusBadRequest, api.CodeInvalidJSON, "malformed JSON: "+err.Error())
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers within ReadyTimeout even when the check hangs. Ready
// means hiloop can serve (Options.Ready); the isolation boundary's state
// rides along as one word, since anyone may ask: which objects fail is in
// the 503 cluster_not_hardened that creates and starts get, in
// hiloop_self_check and in the log. Why it is not ready is logged, not
// sent.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.ready.check(r.Context(), s.o.Ready, s.o.ReadyTimeout); err != nil {
		// Probes ask often, and not ready is expected while starting.
		s.log.Debug("not ready", "err", err)
		d := errNotReady.detail
		d.RequestID = info(r).id
		writeJSON(w, errNotReady.status, api.ErrorBody{Error: d})
		return
	}
	writeJSON(w, http.StatusOK, readyBody{Status: "ready", Boundary: s.o.Control.BoundaryState()})
}

// readyBody is /readyz's answer when ready. Boundary is hardened,
// not_hardened (creates and starts are refused) or insecure (only failures
// the deployment allows, --insecure-no-gvisor).
type readyBody struct {
	Status   string `json:"status"`
	Boundary string `json:"boundary"`
}
