package server

import (
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
	cr, err := control.NewCreateRequest(req, idem)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, outcome, err := s.o.Control.Create(r.Context(), caller(r), cr)
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
		s.writeError(w, r, fieldError("while", fmt.Sprintf("%q is not a state", control.Truncate(while))))
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
		sb, err = s.o.Control.Sandbox(r.Context(), caller(r), r.PathValue("id"))
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
	opts := store.ListOptions{After: q.Get("after"), Limit: 100}
	if err := knownQuery(q, "state", "label", "limit", "after"); err != nil {
		s.writeError(w, r, err)
		return
	}
	if st := q.Get("state"); st != "" {
		if !validState(st) {
			s.writeError(w, r, fieldError("state", fmt.Sprintf("%q is not a state", control.Truncate(st))))
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
				s.writeError(w, r, fieldError("label", fmt.Sprintf("%q is not key=value", control.Truncate(l))))
				return
			}
			opts.Labels[k] = v
		}
	}
	list, next, err := s.o.Control.Sandboxes(r.Context(), caller(r), opts)
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
	u, err := control.NewUpdate(req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.o.Control.Update(r.Context(), caller(r), r.PathValue("id"), u)
	if err != nil {
		s.writeError(w, r, err)
		return
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
	evs, err := s.o.Control.Events(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.EventList{Items: store.APIList[store.Event, api.Event](evs)})
}
