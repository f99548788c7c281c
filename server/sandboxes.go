package server

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/store"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	if len(idem) > 255 {
		s.writeError(w, r, &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidField, Field: "Idempotency-Key", Message: "Idempotency-Key: at most 255 characters"}})
		return
	}
	spec, err := validateCreate(req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var idle *time.Duration
	if req.IdleTimeout != "" {
		d, err := parseIdleTimeout(req.IdleTimeout)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		idle = &d
	}
	sb, outcome, err := s.o.Control.Create(r.Context(), caller(r), control.CreateRequest{
		Spec: spec, IdempotencyKey: idem, RequestHash: canonicalHash(req), IdleTimeout: idle})
	if errors.Is(err, store.ErrConflict) && idem != "" {
		err = newError(http.StatusConflict, api.CodeIdempotencyConflict, "Idempotency-Key was already used with a different request")
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch outcome {
	case control.Replayed:
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, sb.API())
	case control.Accepted:
		// The record stands and is resolved from evidence; retrying would
		// only find it again.
		writeJSON(w, http.StatusAccepted, sb.API())
	default:
		writeJSON(w, http.StatusCreated, sb.API())
	}
}

// canonicalHash identifies a create request by its meaning, not its bytes:
// the same request with its keys reordered or other whitespace is the same
// request (encoding/json marshals struct fields in order and map keys
// sorted).
func canonicalHash(req api.CreateSandboxRequest) string {
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// defaultWait is how long GET /v1/sandboxes/{id}?while=STATE waits when the
// request gives no wait.
const defaultWait = 30 * time.Second

// getSandbox answers one sandbox. With while=STATE it is a long poll: it
// answers once the state is other than STATE, or after wait (a duration,
// 30s by default, at most a minute), whichever comes first; at once when the
// key has RateLimits.WaitsPerKey long polls waiting already.
func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := knownQuery(q, "while", "wait"); err != nil {
		s.writeError(w, r, err)
		return
	}
	while, wait := q.Get("while"), defaultWait
	if while != "" && !validState(while) {
		s.writeError(w, r, fieldError("while", fmt.Sprintf("%q is not a state", truncate(while))))
		return
	}
	if q.Has("wait") {
		d, err := time.ParseDuration(q.Get("wait"))
		switch {
		case while == "":
			s.writeError(w, r, fieldError("wait", "wait needs while=STATE"))
			return
		case err != nil || d <= 0 || d > control.MaxWait:
			s.writeError(w, r, fieldError("wait", fmt.Sprintf("must be a duration over 0 and at most %s, such as 30s", control.MaxWait)))
			return
		}
		wait = d
	}
	var sb store.Sandbox
	var err error
	if while == "" || info(r).noWait {
		sb, err = s.o.Store.Sandbox(r.Context(), caller(r).OrgID, r.PathValue("id"))
	} else {
		sb, err = s.o.Control.WaitWhile(r.Context(), caller(r), r.PathValue("id"), store.State(while), wait)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb.API())
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := store.ListOptions{OrgID: caller(r).OrgID, After: q.Get("after"), Limit: 100}
	if err := knownQuery(q, "state", "label", "limit", "after"); err != nil {
		s.writeError(w, r, err)
		return
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
	writeJSON(w, http.StatusOK, api.SandboxList{Items: store.APIList[store.Sandbox, api.Sandbox](list), Next: next})
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
	s.setMode(w, r, store.ModeStopped)
}

func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request) {
	s.setMode(w, r, store.ModeRunning)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	s.setMode(w, r, store.ModeDeleted)
}

func (s *Server) setMode(w http.ResponseWriter, r *http.Request, mode store.Mode) {
	if err := emptyBody(w, r); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.o.Control.SetMode(r.Context(), caller(r), r.PathValue("id"), mode)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb.API())
}

func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.UpdateSandboxRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TTL == "" && req.IdleTimeout == "" {
		s.writeError(w, r, fieldError("ttl", "ttl or idle_timeout is required"))
		return
	}
	// Both are checked before either is set.
	var ttl, idle time.Duration
	var err error
	if req.TTL != "" {
		if ttl, err = parseTTL("ttl", req.TTL); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if req.IdleTimeout != "" {
		if idle, err = parseIdleTimeout(req.IdleTimeout); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	var sb store.Sandbox
	if req.TTL != "" {
		if sb, err = s.o.Control.SetTTL(r.Context(), caller(r), r.PathValue("id"), ttl); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if req.IdleTimeout != "" {
		if sb, err = s.o.Control.SetIdleTimeout(r.Context(), caller(r), r.PathValue("id"), idle); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, sb.API())
}

// touchSandbox counts a use of the sandbox now: its idle clock starts
// again.
func (s *Server) touchSandbox(w http.ResponseWriter, r *http.Request) {
	if err := emptyBody(w, r); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.o.Control.Touch(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb.API())
}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	evs, err := s.o.Store.Events(r.Context(), caller(r).OrgID, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.EventList{Items: store.APIList[store.Event, api.Event](evs)})
}
