package store

import (
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/receipt"
)

// The records map themselves to the API's types here, and only here, field
// by field, for the server and for the offline admin commands alike: a
// record's struct is not the contract, and a field added to one shows in
// no answer until it is mapped.

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

// stoppedBy says who stopped a sandbox that is stopping, stopped or
// expired: its TTL, someone outside hiloop, hiloop for idleness, or its
// owner (records older than the stop cause say none: the API's stop was
// the only one). "" otherwise, a delete under way included.
func stoppedBy(sb Sandbox) string {
	switch {
	case sb.State == StateExpired:
		return api.StoppedByTTL
	case sb.State != StateStopping && sb.State != StateStopped:
		return ""
	case sb.ModeOutside:
		return api.StoppedByOutside
	case sb.DesiredMode != ModeStopped:
		return ""
	case sb.StopCause == StopIdle:
		return api.StoppedByIdle
	}
	return api.StoppedByUser
}

// API is the sandbox as the API shows it, computed from its record.
func (sb Sandbox) API() api.Sandbox {
	out := api.Sandbox{
		ID: sb.ID, State: api.State(sb.State), Anomaly: sb.Anomaly, Reason: sb.Reason, ExitCode: sb.ExitCode, Desired: api.Mode(sb.DesiredMode),
		Image: sb.Spec.Image,
		Resources: api.Resources{CPURequest: sb.Spec.CPURequest, CPULimit: sb.Spec.CPULimit,
			MemoryRequest: sb.Spec.MemoryRequest, MemoryLimit: sb.Spec.MemoryLimit},
		ShutdownPolicy: sb.Spec.ShutdownPolicy, ExpiresAt: sb.ExpiresAt,
		Volumes: []api.VolumeRequest{}, Labels: map[string]string{}, Env: map[string]string{}, Transports: transportNames(sb.Spec.Transports),
		IdleTimeout: sb.IdleTimeout.String(), LastActivityAt: sb.LastActivityAt, StoppedBy: stoppedBy(sb),
		CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt,
		RuntimeObserved: string(sb.RuntimeObserved), KernelRelease: sb.RuntimeRelease,
	}
	if r, err := receipt.Parse(sb.Receipt); err == nil {
		out.Isolation = r.Isolation()
	}
	if sb.Spec.TTLSeconds > 0 {
		out.TTL = (time.Duration(sb.Spec.TTLSeconds) * time.Second).String()
	}
	for _, v := range sb.Spec.Volumes {
		out.Volumes = append(out.Volumes, api.VolumeRequest(v))
	}
	for k, v := range sb.Spec.Labels {
		out.Labels[k] = v
	}
	for k, v := range sb.Spec.Env {
		out.Env[k] = v
	}
	return out
}

// transportNames are the transports as the API names them.
func transportNames(ts []receipt.Transport) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

// API is the preview as the API shows it, served at url.
func (p Preview) API(url string) api.Preview {
	return api.Preview{ID: p.ID, SandboxID: p.SandboxID, Port: p.Port, Auth: p.Auth, URL: url, CreatedAt: p.CreatedAt, ExpiresAt: p.ExpiresAt}
}
