package control

import (
	"context"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/store"
)

// CreateKey makes a new API key for the caller's organization and returns
// it with its secret, which is shown only this once.
func (c *Control) CreateKey(ctx context.Context, who Caller, name string) (store.APIKey, string, error) {
	return c.o.Store.CreateKey(ctx, who.OrgID, name)
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
// registered anywhere already is store.ErrKeyRegistered, whichever
// organization holds it.
func (c *Control) AddSSHKey(ctx context.Context, who Caller, name string, key gossh.PublicKey) (store.SSHKey, error) {
	return c.o.Store.AddSSHKey(ctx, who.OrgID, name, key)
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

// noOrg is an organization id no organization has: lookups for a key that
// is not registered use it, so they cost what a real lookup costs.
const noOrg = "org_-"

// SSHCaller is who an SSH connection for sandbox id authenticates as with
// this key: the organization that registered the key, if it has the sandbox.
// An unregistered key, an absent sandbox and another organization's sandbox
// all answer false after the same two lookups, so they cannot be told apart.
func (c *Control) SSHCaller(ctx context.Context, key gossh.PublicKey, id string) (Caller, bool) {
	k, kerr := c.o.Store.SSHKeyByFingerprint(ctx, gossh.FingerprintSHA256(key))
	org := k.OrgID
	if kerr != nil {
		org = noOrg
	}
	_, serr := c.o.Store.Sandbox(ctx, org, id)
	if kerr != nil || serr != nil {
		return Caller{}, false
	}
	return Caller{OrgID: k.OrgID, KeyID: k.ID}, true
}
