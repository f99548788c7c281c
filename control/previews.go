package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// A preview serves a port of a sandbox at a URL of its own (package server
// routes it by host name). Its visitors reach the port over the same helper
// leg as ssh -L, admitted here as forward sessions of a Caller that names
// the preview: Admit, Wake and the sweep hold such a caller to the preview
// as well as to its key (keyLive), so a preview revoked, expired, or whose
// key was revoked admits nothing more, and its open connections end.

// Preview limits.
const (
	// DefaultPreviewTTL is how long a preview lives when its request names
	// no ttl; MinPreviewTTL to MaxTTL may be asked for.
	DefaultPreviewTTL = 24 * time.Hour
	MinPreviewTTL     = time.Second
	// DefaultPreviewsPerSandbox is Limits.PreviewsPerSandbox when zero.
	DefaultPreviewsPerSandbox = 16
)

// PreviewRequest asks for a preview of a sandbox's port.
type PreviewRequest struct {
	Port int
	// Auth is store.PreviewAuthToken (the default when empty) or
	// store.PreviewAuthKey.
	Auth string
	// TTL is a duration such as "1h"; DefaultPreviewTTL when empty.
	TTL string
}

// validate checks req and returns its auth and ttl.
func (req PreviewRequest) validate() (auth string, ttl time.Duration, err error) {
	if req.Port < 1 || req.Port > 65535 {
		return "", 0, invalid("port", "must be a TCP port, 1 to 65535")
	}
	switch req.Auth {
	case "", store.PreviewAuthToken:
		auth = store.PreviewAuthToken
	case store.PreviewAuthKey:
		auth = store.PreviewAuthKey
	default:
		return "", 0, invalid("auth", fmt.Sprintf("%q is neither token nor key", Truncate(req.Auth)))
	}
	ttl = DefaultPreviewTTL
	if req.TTL != "" {
		if ttl, err = time.ParseDuration(req.TTL); err != nil {
			return "", 0, invalid("ttl", fmt.Sprintf("%q is not a duration such as 90m or 24h", Truncate(req.TTL)))
		}
		if ttl < MinPreviewTTL || ttl > MaxTTL {
			return "", 0, invalid("ttl", fmt.Sprintf("%s is outside %s to %s", ttl, MinPreviewTTL, MaxTTL))
		}
	}
	return auth, ttl, nil
}

// CreatePreview makes a preview of one of the caller's organization's
// sandboxes, which must have the forward transport (a *TransportError
// otherwise), within Limits.PreviewsPerSandbox live previews
// (store.ErrPreviewLimit). It returns the preview and, for token auth, its
// token, which is shown only this once: the record keeps its hash. The
// sandbox need not run; a visit wakes it as ssh -L does.
func (c *Control) CreatePreview(ctx context.Context, who Caller, id string, req PreviewRequest) (store.Preview, string, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return store.Preview{}, "", err
	}
	if who.Preview != "" {
		// A preview's visitor acts for the preview, never makes one.
		return store.Preview{}, "", ErrUnauthenticated
	}
	auth, ttl, err := req.validate()
	if err != nil {
		return store.Preview{}, "", err
	}
	sb, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
	if err != nil {
		return store.Preview{}, "", err
	}
	if !receipt.Record(sb.Receipt).Has(receipt.TransportForward) {
		return store.Preview{}, "", &TransportError{Transport: receipt.TransportForward}
	}
	p, token := store.NewPreview(who.OrgID, id, who.KeyID, req.Port, auth, c.o.Now(), ttl)
	if err := c.o.Store.CreatePreview(ctx, p, token, c.o.Limits.PreviewsPerSandbox); err != nil {
		return store.Preview{}, "", err
	}
	return p, token, nil
}

// Previews lists the live previews of one of the caller's organization's
// sandboxes.
func (c *Control) Previews(ctx context.Context, who Caller, id string) ([]store.Preview, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return nil, err
	}
	if _, err := c.o.Store.Sandbox(ctx, who.OrgID, id); err != nil {
		return nil, err
	}
	return c.o.Store.Previews(ctx, who.OrgID, id, c.o.Now())
}

// RevokePreview deletes a preview of one of the caller's organization's
// sandboxes and ends every connection open through it at once.
func (c *Control) RevokePreview(ctx context.Context, who Caller, id, previewID string) error {
	if err := c.keyLive(ctx, who); err != nil {
		return err
	}
	if err := c.o.Store.DeletePreview(ctx, who.OrgID, id, previewID); err != nil {
		return err
	}
	c.ends.Add(1)
	for _, s := range c.sessions.list() {
		if s.Preview == previewID {
			s.cancel(ErrPreviewRevoked)
		}
	}
	return nil
}

// PreviewCredential is what a preview's visitor presents: the preview's
// token, or (a preview of key auth) the caller an API key authenticated.
type PreviewCredential struct {
	Token string
	// Tokens are more candidate tokens, tried with Token in one lookup: a
	// browser may send several cookies of the name, set by other preview
	// hosts of the domain.
	Tokens []string
	Key    *Caller
}

// PreviewVisitor is the caller a visitor of preview previewID acts as, and
// the preview: a token visitor acts for the key that made the preview, a key
// visitor for its own key, each held to the preview too. An unknown,
// expired or revoked preview, a wrong or missing token, a key of another
// organization, and a credential of the wrong kind are all
// store.ErrNotFound, indistinguishable.
func (c *Control) PreviewVisitor(ctx context.Context, previewID string, cred PreviewCredential) (Caller, store.Preview, error) {
	now := c.o.Now()
	switch {
	case cred.Key != nil:
		if cred.Key.OrgID == "" || cred.Key.KeyID == "" || cred.Key.Preview != "" {
			return Caller{}, store.Preview{}, store.ErrNotFound
		}
		p, err := c.o.Store.LivePreview(ctx, cred.Key.OrgID, previewID, now)
		if err != nil {
			return Caller{}, store.Preview{}, err
		}
		if p.Auth != store.PreviewAuthKey {
			return Caller{}, store.Preview{}, store.ErrNotFound
		}
		return Caller{OrgID: p.OrgID, KeyID: cred.Key.KeyID, Preview: p.ID}, p, nil
	case cred.Token != "" || len(cred.Tokens) > 0:
		p, err := c.o.Store.PreviewByTokens(ctx, previewID, append([]string{cred.Token}, cred.Tokens...), now)
		if err != nil {
			return Caller{}, store.Preview{}, err
		}
		return Caller{OrgID: p.OrgID, KeyID: p.KeyID, Preview: p.ID}, p, nil
	}
	return Caller{}, store.Preview{}, store.ErrNotFound
}

// previewLive is nil when who names no preview, or a preview of its
// organization that works now; ErrUnauthenticated otherwise.
func (c *Control) previewLive(ctx context.Context, who Caller) error {
	if who.Preview == "" {
		return nil
	}
	_, err := c.o.Store.LivePreview(ctx, who.OrgID, who.Preview, c.o.Now())
	if errors.Is(err, store.ErrNotFound) {
		return ErrUnauthenticated
	}
	return err
}
