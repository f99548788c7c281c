package store

import "github.com/hiloop/hiloop/api"

// The records the API shows as they are map themselves to the API's types
// here, field by field, for the server and for the offline admin commands
// alike: a record's struct is not the contract, and a field added to one
// shows in no answer until it is mapped. A sandbox, which the API shows
// computed, is mapped by the server.

// API is the organization as the API shows it.
func (o Org) API() api.Org {
	out := api.Org{ID: o.ID, Name: o.Name, MaxSandboxes: o.MaxSandboxes, MaxRunning: o.MaxRunning, CreatedAt: o.CreatedAt}
	if o.IdleTimeout != nil {
		out.IdleTimeout = o.IdleTimeout.String()
	}
	return out
}

// API is the key as the API shows it, without its secret.
func (k APIKey) API() api.APIKey {
	return api.APIKey{ID: k.ID, OrgID: k.OrgID, Name: k.Name, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt}
}

// API is the SSH key as the API shows it.
func (k SSHKey) API() api.SSHKey {
	return api.SSHKey{ID: k.ID, OrgID: k.OrgID, Name: k.Name, Fingerprint: k.Fingerprint, PublicKey: k.PublicKey, CreatedAt: k.CreatedAt}
}

// API is the event as the API shows it.
func (e Event) API() api.Event {
	return api.Event{Seq: e.Seq, At: e.At, From: api.State(e.From), To: api.State(e.To), Reason: e.Reason}
}

// APIList maps a list of records to the API's types; never nil, so JSON
// shows [].
func APIList[R interface{ API() A }, A any](in []R) []A {
	out := make([]A, 0, len(in))
	for _, r := range in {
		out = append(out, r.API())
	}
	return out
}
