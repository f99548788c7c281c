package server

import (
	"errors"
	"net/http"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/store"
)

func (s *Server) getOrg(w http.ResponseWriter, r *http.Request) {
	org, err := s.o.Control.Org(r.Context(), caller(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := org.API()
	var u api.OrgSessions
	u.Open, u.BusiestSandbox = s.o.Control.OrgSessions(org.ID)
	u.MaxPerSandbox, u.MaxPerOrg = s.o.Control.SessionLimits()
	out.Sessions = &u
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.o.Control.Keys(r.Context(), caller(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.KeyList{Items: store.APIList[store.APIKey, api.APIKey](keys)})
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	var req api.CreateKeyRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Name) > 64 {
		s.writeError(w, r, fieldError("name", "at most 64 characters"))
		return
	}
	k, secret, err := s.o.Control.CreateKey(r.Context(), caller(r), req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.CreatedKey{APIKey: k.API(), Secret: secret})
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	if err := s.o.Control.RevokeKey(r.Context(), caller(r), r.PathValue("id")); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = newError(http.StatusNotFound, api.CodeNotFound, "no such key")
		}
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
