package server

import (
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/store"
)

// stoppedBy says who stopped a sandbox that is stopping, stopped or
// expired: its TTL, someone outside hiloop, hiloop for idleness, or its
// owner (records older than the stop cause say none: the API's stop was
// the only one). "" otherwise, a delete under way included.
func stoppedBy(sb store.Sandbox) string {
	switch {
	case sb.State == store.StateExpired:
		return api.StoppedByTTL
	case sb.State != store.StateStopping && sb.State != store.StateStopped:
		return ""
	case sb.ModeOutside:
		return api.StoppedByOutside
	case sb.DesiredMode != store.ModeStopped:
		return ""
	case sb.StopCause == store.StopIdle:
		return api.StoppedByIdle
	}
	return api.StoppedByUser
}

// toAPI is a sandbox as the API shows it, computed from its record field by
// field: the record's struct is not the contract.
func toAPI(sb store.Sandbox) api.Sandbox {
	out := api.Sandbox{
		ID: sb.ID, State: api.State(sb.State), Anomaly: sb.Anomaly, Reason: sb.Reason, ExitCode: sb.ExitCode, Desired: api.Mode(sb.DesiredMode),
		Image: sb.Spec.Image,
		Resources: api.Resources{CPURequest: sb.Spec.CPURequest, CPULimit: sb.Spec.CPULimit,
			MemoryRequest: sb.Spec.MemoryRequest, MemoryLimit: sb.Spec.MemoryLimit},
		ShutdownPolicy: sb.Spec.ShutdownPolicy, ExpiresAt: sb.ExpiresAt,
		Volumes: []api.VolumeRequest{}, Labels: map[string]string{}, Transports: transportNames(sb.Spec.Transports),
		IdleTimeout: sb.IdleTimeout.String(), LastActivityAt: sb.LastActivityAt, StoppedBy: stoppedBy(sb),
		CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt,
		RuntimeObserved: string(sb.RuntimeObserved), KernelRelease: sb.RuntimeRelease,
	}
	if r, err := sandbox.ParseReceipt(sb.Receipt); err == nil {
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
	return out
}

// transportNames are the transports as the API names them.
func transportNames(ts []sandbox.Transport) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

// mappedSandboxes maps a page of records; never nil, so JSON shows [].
func mappedSandboxes(list []store.Sandbox) []api.Sandbox {
	out := make([]api.Sandbox, 0, len(list))
	for _, sb := range list {
		out = append(out, toAPI(sb))
	}
	return out
}
