package server

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/store"
)

// Previews configure preview URLs: a sandbox's port served at
// SCHEME://pv-ID.DOMAIN/ by this server, over the same helper leg as ssh -L.
type Previews struct {
	// Domain is the preview domain, host[:port]: the port, when given, is
	// the one the URLs carry. Off when empty.
	Domain string
	// Scheme is the URLs' scheme: "https", or "http" for plain-HTTP
	// development on loopback.
	Scheme string
	// Dial opens a stream to port on the loopback of the session's
	// sandbox (sshd.Gateway.DialPort); required with Domain.
	Dial func(sess *control.Session, port int) (net.Conn, error)
}

// previewHostPrefix starts the first label of every preview host: the
// preview id, pv_ID, is pv-ID there, a valid DNS label.
const previewHostPrefix = "pv-"

// previewTokenParam is the query parameter, and previewCookie the cookie, a
// token visitor presents the token in. Both are hiloop's: stripped before
// a request reaches the sandbox.
const (
	previewTokenParam = "hiloop_preview_token"
	previewCookie     = "hiloop_preview_token"
)

var errPreviewsDisabled = newError(http.StatusNotFound, api.CodePreviewsDisabled, "this deployment serves no previews (hiloop serve --preview-domain)")

// previewDomain is the preview domain's host name, lower-case; "" when
// previews are off.
func (s *Server) previewDomain() string {
	d := s.o.Previews.Domain
	if d == "" {
		return ""
	}
	if h, _, err := net.SplitHostPort(d); err == nil {
		d = h
	}
	return strings.ToLower(d)
}

// previewURL is the URL of preview id, with token in its query when set.
func (s *Server) previewURL(id, token string) string {
	u := url.URL{Scheme: s.o.Previews.Scheme, Host: previewHostPrefix + strings.TrimPrefix(id, "pv_") + "." + s.o.Previews.Domain, Path: "/"}
	if token != "" {
		u.RawQuery = url.Values{previewTokenParam: {token}}.Encode()
	}
	return u.String()
}

func (s *Server) createPreview(w http.ResponseWriter, r *http.Request) {
	if s.o.Previews.Domain == "" {
		s.writeError(w, r, errPreviewsDisabled)
		return
	}
	var req api.CreatePreviewRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	p, token, err := s.o.Control.CreatePreview(r.Context(), caller(r), r.PathValue("id"),
		control.PreviewRequest{Port: req.Port, Auth: req.Auth, TTL: req.TTL})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := p.API(s.previewURL(p.ID, token))
	out.Token = token
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listPreviews(w http.ResponseWriter, r *http.Request) {
	if s.o.Previews.Domain == "" {
		s.writeError(w, r, errPreviewsDisabled)
		return
	}
	ps, err := s.o.Control.Previews(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.PreviewList{Items: make([]api.Preview, 0, len(ps))}
	for _, p := range ps {
		out.Items = append(out.Items, p.API(s.previewURL(p.ID, "")))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokePreview(w http.ResponseWriter, r *http.Request) {
	if s.o.Previews.Domain == "" {
		s.writeError(w, r, errPreviewsDisabled)
		return
	}
	err := s.o.Control.RevokePreview(r.Context(), caller(r), r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = errNoPreview
		}
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// errNoPreview is the one answer for a preview that is absent, another
// organization's, expired or revoked, and for a visitor without the right
// token or key.
var errNoPreview = newError(http.StatusNotFound, api.CodeNotFound, "no such preview")
