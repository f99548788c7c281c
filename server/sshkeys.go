package server

import (
	"errors"
	"net/http"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/store"
)

func (s *Server) addSSHKey(w http.ResponseWriter, r *http.Request) {
	var req api.AddSSHKeyRequest
	if err := decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	key, comment, err := parseSSHKey(req.PublicKey)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name := req.Name
	if name == "" {
		name = comment
	}
	if len(name) > 64 {
		s.writeError(w, r, fieldError("name", "at most 64 characters"))
		return
	}
	k, err := s.o.Control.AddSSHKey(r.Context(), caller(r), name, key)
	if errors.Is(err, store.ErrKeyRegistered) {
		// Only the caller's own organization can hold the key it
		// collides with: another's registration is no conflict.
		err = newError(http.StatusConflict, api.CodeSSHKeyRegistered, "your organization has already registered this public key")
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, k.API())
}

// parseSSHKey reads one authorized_keys line and refuses what the gateway
// will not accept.
func parseSSHKey(line string) (gossh.PublicKey, string, error) {
	line = strings.TrimSpace(line)
	if line == "" {
		return nil, "", fieldError("public_key", "is required")
	}
	if strings.ContainsAny(line, "\r\n") {
		return nil, "", fieldError("public_key", "one key, on one line")
	}
	key, comment, options, _, err := gossh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, "", fieldError("public_key", "not a public key in authorized_keys form (ssh-ed25519 AAAA...)")
	}
	if len(options) > 0 {
		return nil, "", fieldError("public_key", "authorized_keys options are not accepted")
	}
	if _, ok := key.(*gossh.Certificate); ok {
		return nil, "", fieldError("public_key", "certificates are not accepted; register the plain key")
	}
	if ck, ok := key.(gossh.CryptoPublicKey); ok && key.Type() == gossh.KeyAlgoRSA {
		if rk, ok := ck.CryptoPublicKey().(interface{ Size() int }); ok && rk.Size()*8 < 2048 {
			return nil, "", fieldError("public_key", "RSA keys need at least 2048 bits")
		}
	}
	return key, comment, nil
}

func (s *Server) listSSHKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.o.Control.SSHKeys(r.Context(), caller(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SSHKeyList{Items: store.APIList[store.SSHKey, api.SSHKey](keys)})
}

func (s *Server) deleteSSHKey(w http.ResponseWriter, r *http.Request) {
	if err := s.o.Control.DeleteSSHKey(r.Context(), caller(r), r.PathValue("id")); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = newError(http.StatusNotFound, api.CodeNotFound, "no such ssh key")
		}
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) hostKey(w http.ResponseWriter, r *http.Request) {
	if s.o.HostKey == nil {
		writeJSON(w, http.StatusOK, api.HostKey{})
		return
	}
	writeJSON(w, http.StatusOK, api.HostKey{
		PublicKey:   strings.TrimSpace(string(gossh.MarshalAuthorizedKey(s.o.HostKey))),
		Fingerprint: gossh.FingerprintSHA256(s.o.HostKey), Port: s.o.SSHPort})
}
