// Package server is hiloop's HTTP API. Every read is answered from the
// product record; writes go to the record first and then, through the k8s
// write vocabulary, to the cluster.
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
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hiloop/hiloop/store"
)

// MaxBodyBytes caps every request body.
const MaxBodyBytes = 64 << 10

// Cluster is what the API needs of the cluster: k8s.Writer satisfies it.
type Cluster interface {
	Create(ctx context.Context, sb store.Sandbox) error
	SetMode(ctx context.Context, id string, mode store.Mode) error
	SetExpiry(ctx context.Context, id string, at time.Time) error
	Delete(ctx context.Context, id string) error
}

// Options configure New.
type Options struct {
	Store   *store.Store
	Cluster Cluster
	Caps    Capabilities
	Log     *slog.Logger
	Now     func() time.Time
	// Ready reports whether the server may take traffic (cluster checked,
	// mirror synced); /readyz answers 503 with its error until it is nil.
	Ready func(ctx context.Context) error
	// Observe asks the mirror to re-decide a sandbox now; optional.
	Observe func(id string)
	// ClusterTimeout bounds each cluster write; 15s when zero.
	ClusterTimeout time.Duration
	// Exec runs commands in sandboxes; exec is answered 503 without it.
	Exec Executor
	// ExecLimits bound concurrent exec sessions; 8 per sandbox and 32 per
	// organization when zero.
	ExecLimits ExecLimits
}

// Server is the HTTP API.
type Server struct {
	o   Options
	log *slog.Logger
	mux *http.ServeMux

	// sandboxLocks serialise mutations of one sandbox, so that the record
	// and the cluster see them in the same order.
	locks sync.Map
	execs sessions
}

// New builds the API.
func New(o Options) (*Server, error) {
	if o.Store == nil || o.Cluster == nil {
		return nil, errors.New("server: store and cluster are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Ready == nil {
		o.Ready = func(context.Context) error { return nil }
	}
	if o.Observe == nil {
		o.Observe = func(string) {}
	}
	if o.ClusterTimeout == 0 {
		o.ClusterTimeout = 15 * time.Second
	}
	if o.ExecLimits.PerSandbox == 0 {
		o.ExecLimits.PerSandbox = 8
	}
	if o.ExecLimits.PerOrg == 0 {
		o.ExecLimits.PerOrg = 32
	}
	if o.Exec == nil {
		o.Exec = noExec{}
	}
	s := &Server{o: o, log: o.Log.With("component", "api"), mux: http.NewServeMux(),
		execs: sessions{bySandbox: map[string]int{}, byOrg: map[string]int{}}}
	for _, rt := range s.routes() {
		h := rt.handler
		if rt.auth {
			h = s.authenticated(h)
		}
		s.mux.HandleFunc(rt.pattern, h)
	}
	return s, nil
}

// route is one entry of the API. Routes lists them for the OpenAPI test.
type route struct {
	pattern string
	auth    bool
	handler http.HandlerFunc
}

func (s *Server) routes() []route {
	return []route{
		{"GET /healthz", false, s.healthz},
		{"GET /readyz", false, s.readyz},
		{"GET /v1/openapi.json", false, s.openapi},
		{"GET /v1/org", true, s.getOrg},
		{"GET /v1/keys", true, s.listKeys},
		{"POST /v1/keys", true, s.createKey},
		{"DELETE /v1/keys/{id}", true, s.revokeKey},
		{"POST /v1/sandboxes", true, s.createSandbox},
		{"GET /v1/sandboxes", true, s.listSandboxes},
		{"GET /v1/sandboxes/{id}", true, s.getSandbox},
		{"PATCH /v1/sandboxes/{id}", true, s.updateSandbox},
		{"DELETE /v1/sandboxes/{id}", true, s.deleteSandbox},
		{"POST /v1/sandboxes/{id}/stop", true, s.stopSandbox},
		{"POST /v1/sandboxes/{id}/start", true, s.startSandbox},
		{"GET /v1/sandboxes/{id}/events", true, s.sandboxEvents},
		{"GET /v1/sandboxes/{id}/exec", true, s.execStream},
		{"POST /v1/sandboxes/{id}/exec/run", true, s.execRun},
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

// ServeHTTP serves the API, recovering a panic into a 500 and answering
// unknown paths and methods with the JSON envelope.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("panic", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			writeJSON(w, http.StatusInternalServerError, ErrorBody{Error: ErrorDetail{Code: CodeInternal, Message: "internal error"}})
		}
	}()
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
			s.writeError(w, r, newError(http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
			return
		}
	}
	s.writeError(w, r, newError(http.StatusNotFound, CodeNotFound, "no such route "+r.URL.Path))
}

type ctxKey struct{}

// authenticated resolves the bearer key and puts the key that actually
// authenticated into the request context; handlers authorize against it.
func (s *Server) authenticated(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		secret, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || secret == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="hiloop"`)
			s.writeError(w, r, newError(http.StatusUnauthorized, CodeUnauthorized, "missing bearer token"))
			return
		}
		key, err := s.o.Store.Authenticate(r.Context(), secret)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				s.writeError(w, r, err)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="hiloop", error="invalid_token"`)
			s.writeError(w, r, newError(http.StatusUnauthorized, CodeUnauthorized, "invalid or revoked key"))
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, key)))
	}
}

func caller(r *http.Request) store.APIKey { return r.Context().Value(ctxKey{}).(store.APIKey) }

// decode reads a JSON body of at most MaxBodyBytes into v, refusing unknown
// fields and trailing data. It returns the raw body too.
func decode(w http.ResponseWriter, r *http.Request, v any) ([]byte, error) {
	return decodeLimit(w, r, v, MaxBodyBytes)
}

// decodeLimit is decode with another size cap.
func decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return nil, newError(http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "Content-Type must be application/json")
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, newError(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("body exceeds %d bytes", limit))
		}
		return nil, newError(http.StatusBadRequest, CodeInvalidJSON, "could not read body")
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, jsonError(err)
	}
	if dec.More() {
		return nil, newError(http.StatusBadRequest, CodeInvalidJSON, "body holds more than one JSON value")
	}
	return body, nil
}

func jsonError(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		f := te.Field
		if f == "" {
			f = "body"
		}
		return &apiError{status: http.StatusBadRequest, detail: ErrorDetail{Code: CodeInvalidField, Field: f,
			Message: fmt.Sprintf("%s: expected %s, got JSON %s", f, te.Type, te.Value)}}
	case errors.As(err, &se):
		return newError(http.StatusBadRequest, CodeInvalidJSON, fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, err))
	case errors.Is(err, io.EOF):
		return newError(http.StatusBadRequest, CodeInvalidJSON, "empty body")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &apiError{status: http.StatusBadRequest, detail: ErrorDetail{Code: CodeUnknownField, Field: f, Message: "unknown field " + f}}
	default:
		return newError(http.StatusBadRequest, CodeInvalidJSON, "malformed JSON: "+err.Error())
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.o.Ready(ctx); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: ErrorDetail{Code: CodeNotReady, Message: err.Error()}})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) getOrg(w http.ResponseWriter, r *http.Request) {
	org, err := s.o.Store.Org(r.Context(), caller(r).OrgID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, org)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.o.Store.Keys(r.Context(), caller(r).OrgID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, KeyList{Items: nonNil(keys)})
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	var req CreateKeyRequest
	if _, err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Name) > 64 {
		s.writeError(w, r, fieldError("name", "at most 64 characters"))
		return
	}
	k, secret, err := s.o.Store.CreateKey(r.Context(), caller(r).OrgID, req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, CreatedKey{APIKey: k, Secret: secret})
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	if err := s.o.Store.RevokeKey(r.Context(), caller(r).OrgID, r.PathValue("id")); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = newError(http.StatusNotFound, CodeNotFound, "no such key")
		}
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// lock serialises mutations of one sandbox.
func (s *Server) lock(id string) func() {
	v, _ := s.locks.LoadOrStore(id, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// clusterCtx bounds one cluster write. It is detached from the request, so
// a client that hangs up cannot leave the record and the cluster half-done.
func (s *Server) clusterCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.o.ClusterTimeout)
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req CreateSandboxRequest
	body, err := decode(w, r, &req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	if len(idem) > 255 {
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, detail: ErrorDetail{Code: CodeInvalidField, Field: "Idempotency-Key", Message: "Idempotency-Key: at most 255 characters"}})
		return
	}
	spec, expires, err := validateCreate(req, s.o.Caps, s.o.Now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sum := sha256.Sum256(body)
	sb, created, err := s.o.Store.CreateSandbox(r.Context(), store.NewSandbox{
		OrgID: caller(r).OrgID, Spec: spec, ExpiresAt: expires, IdempotencyKey: idem, RequestHash: hex.EncodeToString(sum[:])})
	if errors.Is(err, store.ErrConflict) && idem != "" {
		err = newError(http.StatusConflict, CodeIdempotencyConflict, "Idempotency-Key was already used with a different request")
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !created {
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, toAPI(sb))
		return
	}
	unlock := s.lock(sb.ID)
	defer unlock()
	ctx, cancel := s.clusterCtx()
	defer cancel()
	if err := s.o.Cluster.Create(ctx, sb); err != nil {
		s.failCreate(sb, err)
		s.writeError(w, r, clusterErr(err))
		return
	}
	writeJSON(w, http.StatusCreated, toAPI(sb))
}

// failCreate records that the cluster refused or never got a sandbox, so the
// record says so instead of staying pending.
func (s *Server) failCreate(sb store.Sandbox, cause error) {
	reason := "cluster write failed: " + apiMessage(cause)
	if _, err := s.o.Store.Observe(context.Background(), sb.ID, store.Observation{State: store.StateFailed, Reason: truncateReason(reason)}); err != nil {
		s.log.Error("record failed create", "sandbox", sb.ID, "err", err)
	}
}

// FinishPending completes a create that was interrupted between the record
// write and the cluster write: it creates the object, or fails the record.
func (s *Server) FinishPending(ctx context.Context, sb store.Sandbox) {
	unlock := s.lock(sb.ID)
	defer unlock()
	var err error
	if sb.DesiredMode == store.ModeDeleted {
		err = s.o.Cluster.Delete(ctx, sb.ID)
	} else {
		err = s.o.Cluster.Create(ctx, sb)
	}
	if err != nil {
		s.log.Warn("interrupted create could not be finished; failing it", "sandbox", sb.ID, "err", err)
		s.failCreate(sb, err)
		return
	}
	s.log.Info("finished interrupted create", "sandbox", sb.ID)
	s.o.Observe(sb.ID)
}

func truncateReason(s string) string {
	if len(s) > 500 {
		return s[:500]
	}
	return s
}

func clusterErr(err error) error {
	if isClusterError(err) {
		return err
	}
	return &clusterError{err}
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.o.Store.Sandbox(r.Context(), caller(r).OrgID, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPI(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := store.ListOptions{OrgID: caller(r).OrgID, After: q.Get("after"), Limit: 100}
	for k := range q {
		switch k {
		case "state", "label", "limit", "after":
		default:
			s.writeError(w, r, &apiError{status: http.StatusBadRequest, detail: ErrorDetail{Code: CodeUnknownField, Field: k, Message: "unknown query parameter " + k}})
			return
		}
	}
	if st := q.Get("state"); st != "" {
		if !validState(st) {
			s.writeError(w, r, fieldError("state", fmt.Sprintf("%q is not a state", truncate(st))))
			return
		}
		opts.State = store.State(st)
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			s.writeError(w, r, fieldError("limit", "must be an integer from 1 to 1000"))
			return
		}
		opts.Limit = n
	}
	if ls := q["label"]; len(ls) > 0 {
		opts.Labels = map[string]string{}
		for _, l := range ls {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				s.writeError(w, r, fieldError("label", fmt.Sprintf("%q is not key=value", truncate(l))))
				return
			}
			opts.Labels[k] = v
		}
		if err := validateLabels("label", opts.Labels); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	list, next, err := s.o.Store.ListSandboxes(r.Context(), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := SandboxList{Items: make([]Sandbox, 0, len(list)), Next: next}
	for _, sb := range list {
		out.Items = append(out.Items, toAPI(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

func validState(s string) bool {
	for _, st := range store.States {
		if string(st) == s {
			return true
		}
	}
	return false
}

func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request) {
	s.setMode(w, r, store.ModeStopped, func(ctx context.Context, id string) error {
		return s.o.Cluster.SetMode(ctx, id, store.ModeStopped)
	})
}

func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request) {
	s.setMode(w, r, store.ModeRunning, func(ctx context.Context, id string) error {
		return s.o.Cluster.SetMode(ctx, id, store.ModeRunning)
	})
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	s.setMode(w, r, store.ModeDeleted, s.o.Cluster.Delete)
}

// setMode records the desired mode, then applies it to the cluster; when
// that fails the record's desired mode is restored. Nothing is sent when the
// mode is unchanged or the sandbox has no object any more.
func (s *Server) setMode(w http.ResponseWriter, r *http.Request, mode store.Mode, apply func(ctx context.Context, id string) error) {
	org, id := caller(r).OrgID, r.PathValue("id")
	if err := emptyBody(w, r); err != nil {
		s.writeError(w, r, err)
		return
	}
	unlock := s.lock(id)
	defer unlock()
	before, err := s.o.Store.Sandbox(r.Context(), org, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.o.Store.SetDesiredMode(r.Context(), org, id, mode)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if before.DesiredMode != mode && !before.State.Terminal() {
		ctx, cancel := s.clusterCtx()
		defer cancel()
		if err := apply(ctx, id); err != nil {
			s.restoreMode(id, before.DesiredMode)
			s.writeError(w, r, clusterErr(err))
			return
		}
	}
	s.o.Observe(id)
	writeJSON(w, http.StatusOK, toAPI(sb))
}

// restoreMode undoes a desired-mode change whose cluster write failed.
func (s *Server) restoreMode(id string, mode store.Mode) {
	if err := s.o.Store.RestoreDesiredMode(context.Background(), id, mode); err != nil {
		s.log.Error("restore desired mode", "sandbox", id, "err", err)
	}
}

// emptyBody accepts an absent, empty or {} body on action endpoints.
func emptyBody(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength == 0 {
		return nil
	}
	var v struct{}
	_, err := decode(w, r, &v)
	if ae, ok := err.(*apiError); ok && ae.detail.Message == "empty body" {
		return nil
	}
	return err
}

func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) {
	org, id := caller(r).OrgID, r.PathValue("id")
	var req UpdateSandboxRequest
	if _, err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TTL == "" {
		s.writeError(w, r, fieldError("ttl", "is required"))
		return
	}
	ttl, err := parseTTL("ttl", req.TTL)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	unlock := s.lock(id)
	defer unlock()
	before, err := s.o.Store.Sandbox(r.Context(), org, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	at := s.o.Now().Add(ttl).UTC().Truncate(time.Second)
	sb, err := s.o.Store.SetExpiry(r.Context(), org, id, at, int64(ttl/time.Second))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := s.clusterCtx()
	defer cancel()
	if err := s.o.Cluster.SetExpiry(ctx, id, at); err != nil {
		if before.ExpiresAt != nil {
			s.o.Store.SetExpiry(context.Background(), org, id, *before.ExpiresAt, before.Spec.TTLSeconds)
		} else {
			s.o.Store.ClearExpiry(context.Background(), id)
		}
		s.writeError(w, r, clusterErr(err))
		return
	}
	writeJSON(w, http.StatusOK, toAPI(sb))
}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	evs, err := s.o.Store.Events(r.Context(), caller(r).OrgID, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, EventList{Items: nonNil(evs)})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
