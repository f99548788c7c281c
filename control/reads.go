package control

import (
	"context"

	"github.com/hiloop/hiloop/store"
)

// The reads of a caller's own records. Each is scoped to the caller's
// organization and fails closed: a caller without an organization or a
// key is ErrUnauthenticated before anything is read, and another
// organization's sandbox is store.ErrNotFound, as an absent one is.

// scoped refuses a caller that names no organization or no key.
func scoped(who Caller) error {
	if who.OrgID == "" || who.KeyID == "" {
		return ErrUnauthenticated
	}
	return nil
}

// Sandbox is one of the caller's organization's sandboxes.
func (c *Control) Sandbox(ctx context.Context, who Caller, id string) (store.Sandbox, error) {
	if err := scoped(who); err != nil {
		return store.Sandbox{}, err
	}
	return c.o.Store.Sandbox(ctx, who.OrgID, id)
}

// Sandboxes lists the caller's organization's sandboxes that match o (its
// OrgID is the caller's, whatever o says), with the cursor of the next
// page. Label filters are checked as a sandbox's labels are.
func (c *Control) Sandboxes(ctx context.Context, who Caller, o store.ListOptions) ([]store.Sandbox, string, error) {
	if err := scoped(who); err != nil {
		return nil, "", err
	}
	if err := ValidateLabels("label", o.Labels); err != nil {
		return nil, "", err
	}
	o.OrgID = who.OrgID
	return c.o.Store.ListSandboxes(ctx, o)
}

// Events are the state transitions of one of the caller's organization's
// sandboxes.
func (c *Control) Events(ctx context.Context, who Caller, id string) ([]store.Event, error) {
	if err := scoped(who); err != nil {
		return nil, err
	}
	return c.o.Store.Events(ctx, who.OrgID, id)
}

// Org is the caller's organization.
func (c *Control) Org(ctx context.Context, who Caller) (store.Org, error) {
	if err := scoped(who); err != nil {
		return store.Org{}, err
	}
	return c.o.Store.Org(ctx, who.OrgID)
}

// Keys are the caller's organization's API keys.
func (c *Control) Keys(ctx context.Context, who Caller) ([]store.APIKey, error) {
	if err := scoped(who); err != nil {
		return nil, err
	}
	return c.o.Store.Keys(ctx, who.OrgID)
}

// SSHKeys are the caller's organization's registered SSH keys.
func (c *Control) SSHKeys(ctx context.Context, who Caller) ([]store.SSHKey, error) {
	if err := scoped(who); err != nil {
		return nil, err
	}
	return c.o.Store.SSHKeys(ctx, who.OrgID)
}
