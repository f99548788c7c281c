package control

import (
	"context"
	"errors"

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
// key could multiply its own.
func (c *Control) CreateKey(ctx context.Context, who Caller, name string) (store.APIKey, string, error) {
	return c.o.Store.CreateKeyWithin(ctx, who.OrgID, name, c.o.Limits.APIKeysPerOrg)
}

// RevokeKey revokes one of the caller's organization's keys (never its last
// live one) and ends every live session opened with it.
func (c *Control) RevokeKey(ctx context.Context, who Caller, keyID string) error {
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
	return c.o.Store.AddSSHKey(ctx, who.OrgID, name, key, c.o.Limits.SSHKeysPerOrg)
}

// DeleteSSHKey removes one of the caller's organization's SSH keys, ends
// every live session opened with it and closes every connection it
// authenticated.
func (c *Control) DeleteSSHKey(ctx context.Context, who Caller, id string) error {
	if err := c.o.Store.DeleteSSHKey(ctx, who.OrgID, id); err != nil {
		return err
	}
	c.end(ErrKeyRevoked, func(key, _ string) bool { return key == id })
	return nil
}

// SSHCaller is who an SSH connection for sandbox id authenticates as with
// this key: the registration of the key by the organization that owns the
// sandbox, found in one lookup of key and sandbox together. When several
// organizations registered the same public key, the sandbox decides whose
// registration applies, so each acts only on its own organization's
// sandboxes. An unregistered key, an absent sandbox and another
// organization's sandbox all answer false, after the same one lookup.
func (c *Control) SSHCaller(ctx context.Context, key gossh.PublicKey, id string) (Caller, bool) {
	if key == nil || id == "" {
		return Caller{}, false
	}
	k, err := c.o.Store.SSHKeyForSandbox(ctx, gossh.FingerprintSHA256(key), id)
	if err != nil || k.OrgID == "" || k.ID == "" {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Error("ssh key lookup", "sandbox", id, "err", err)
		}
		return Caller{}, false
	}
	return Caller{OrgID: k.OrgID, KeyID: k.ID}, true
}
