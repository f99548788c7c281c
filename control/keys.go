package control

import (
	"context"
	"errors"
	"fmt"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/store"
)

// DefaultKeysPerOrg is the most live API keys, and the most SSH keys, an
// organization may have when Limits leave it zero.
const DefaultKeysPerOrg = 100

// CreateKey makes a new API key for the caller's organization and returns
// it with its secret, which is shown only this once. An organization that
// has Limits.APIKeysPerOrg live keys gets a *store.KeyLimitError: any key
// may make keys, and each has its own rate limit, so without a bound one
// key could multiply its own. Like every change, it checks the caller's
// key as the record says now.
func (c *Control) CreateKey(ctx context.Context, who Caller, name string) (store.APIKey, string, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return store.APIKey{}, "", err
	}
	return c.o.Store.CreateKeyWithin(ctx, who.OrgID, name, c.o.Limits.APIKeysPerOrg)
}

// RevokeKey revokes one of the caller's organization's keys (never its last
// live one) and ends every live session opened with it.
func (c *Control) RevokeKey(ctx context.Context, who Caller, keyID string) error {
	if err := c.keyLive(ctx, who); err != nil {
		return err
	}
	if err := c.o.Store.RevokeKey(ctx, who.OrgID, keyID, false); err != nil {
		return err
	}
	c.end(ErrKeyRevoked, func(key, _ string) bool { return key == keyID })
	return nil
}

// AddSSHKey registers an SSH public key for the caller's organization. A key
// the organization registered already is store.ErrKeyRegistered; another
// organization's registration of the same key neither blocks it nor shows.
// An organization with Limits.SSHKeysPerOrg keys gets a
// *store.KeyLimitError: each key holds its own SSH connection places.
func (c *Control) AddSSHKey(ctx context.Context, who Caller, name string, key gossh.PublicKey) (store.SSHKey, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return store.SSHKey{}, err
	}
	return c.o.Store.AddSSHKey(ctx, who.OrgID, name, key, c.o.Limits.SSHKeysPerOrg)
}

// DeleteSSHKey removes one of the caller's organization's SSH keys, ends
// every live session opened with it and closes every connection it
// authenticated.
func (c *Control) DeleteSSHKey(ctx context.Context, who Caller, id string) error {
	if err := c.keyLive(ctx, who); err != nil {
		return err
	}
	if err := c.o.Store.DeleteSSHKey(ctx, who.OrgID, id); err != nil {
		return err
	}
	c.end(ErrKeyRevoked, func(key, _ string) bool { return key == id })
	return nil
}

// Credential is what a caller presents: the secret of an API key (HTTP),
// or an SSH public key with the sandbox it logs in to (SSH, where the
// sandbox is the user name).
type Credential struct {
	Secret string
	// SSHKey and Sandbox: the registration that applies is the one of the
	// organization that owns the sandbox, found in one lookup of key and
	// sandbox together. When several organizations registered the same
	// public key, the sandbox decides whose registration applies, so each
	// acts only on its own organization's sandboxes.
	SSHKey  gossh.PublicKey
	Sandbox string
}

// Authenticate is the one authentication of every way in: it returns the
// caller that cred authenticates, the key's organization and the key
// itself. A revoked or unknown API key, an unregistered SSH key, an absent
// sandbox, another organization's sandbox, and a credential of neither
// kind all answer ErrUnauthenticated, each after at most the same one
// lookup; any other error is the record's (unavailable).
func (c *Control) Authenticate(ctx context.Context, cred Credential) (Caller, error) {
	var who Caller
	switch {
	case cred.Secret != "" && cred.SSHKey == nil && cred.Sandbox == "":
		k, err := c.o.Store.Authenticate(ctx, cred.Secret)
		if err != nil {
			return Caller{}, unauthenticated(err)
		}
		who = Caller{OrgID: k.OrgID, KeyID: k.ID}
	case cred.SSHKey != nil && cred.Sandbox != "" && cred.Secret == "":
		k, err := c.o.Store.SSHKeyForSandbox(ctx, gossh.FingerprintSHA256(cred.SSHKey), cred.Sandbox)
		if err != nil {
			return Caller{}, unauthenticated(err)
		}
		who = Caller{OrgID: k.OrgID, KeyID: k.ID}
	}
	if who.OrgID == "" || who.KeyID == "" {
		return Caller{}, ErrUnauthenticated
	}
	return who, nil
}

// unauthenticated is ErrUnauthenticated for a key the record does not
// hold, and the record's own error otherwise.
func unauthenticated(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return ErrUnauthenticated
	}
	return fmt.Errorf("authenticate: %w", err)
}
