package server

import (
	"time"

	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/store"
)

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	// Image is the OCI image reference to run, entrypoint unmodified.
	Image string `json:"image"`
	// Resources are CPU and memory requests and limits, as Kubernetes
	// quantities ("500m", "1", "256Mi").
	Resources *Resources `json:"resources,omitempty"`
	// TTL is how long the sandbox may live, as a Go duration ("90m", "24h").
	// Empty means no expiry.
	TTL string `json:"ttl,omitempty"`
	// ShutdownPolicy says what expiry does: "retain" (default) keeps the
	// sandbox record and its volumes in state expired; "delete" removes it.
	ShutdownPolicy string `json:"shutdown_policy,omitempty"`
	// Volumes are persistent volumes that survive stop and start.
	Volumes []VolumeRequest `json:"volumes,omitempty"`
	// Transports are the ways in the caller needs ("exec", ...). A transport
	// the deployment does not back is refused with unsupported_capability.
	Transports []string `json:"transports,omitempty"`
	// Labels are the caller's own key/value pairs, usable as list filters.
	Labels map[string]string `json:"labels,omitempty"`
}

// Resources are CPU and memory requests and limits.
type Resources struct {
	CPURequest    string `json:"cpu_request,omitempty"`
	CPULimit      string `json:"cpu_limit,omitempty"`
	MemoryRequest string `json:"memory_request,omitempty"`
	MemoryLimit   string `json:"memory_limit,omitempty"`
}

// VolumeRequest is one persistent volume.
type VolumeRequest struct {
	// Name is a DNS label, unique within the sandbox, not starting with
	// "hiloop-": hiloop's own pod volumes (the session helper's key) use
	// that prefix.
	Name string `json:"name"`
	// Size is a Kubernetes quantity ("1Gi").
	Size string `json:"size"`
	// MountPath is the absolute path in the workload container.
	MountPath string `json:"mount_path"`
	// StorageClass is optional; the cluster default when empty. It must be
	// one the deployment backs.
	StorageClass string `json:"storage_class,omitempty"`
}

// UpdateSandboxRequest is the body of PATCH /v1/sandboxes/{id}.
type UpdateSandboxRequest struct {
	// TTL sets the expiry to now plus this duration: it extends or shortens
	// the sandbox's life.
	TTL string `json:"ttl"`
}

// Sandbox is a sandbox as the API shows it, computed from the record only.
type Sandbox struct {
	ID string `json:"id"`
	// State is the observed state (see docs/states.md).
	State store.State `json:"state"`
	// Anomaly names the contradiction behind attention or quarantined.
	Anomaly string `json:"anomaly,omitempty"`
	// Reason says more about the state, when there is more to say.
	Reason string `json:"reason,omitempty"`
	// ExitCode is the workload's exit code once it exited.
	ExitCode *int `json:"exit_code,omitempty"`
	// Desired is what the API was last asked for: running, stopped, deleted.
	Desired        store.Mode        `json:"desired"`
	Image          string            `json:"image"`
	Resources      Resources         `json:"resources"`
	TTL            string            `json:"ttl,omitempty"`
	ShutdownPolicy string            `json:"shutdown_policy"`
	ExpiresAt      *time.Time        `json:"expires_at,omitempty"`
	Volumes        []VolumeRequest   `json:"volumes"`
	Labels         map[string]string `json:"labels"`
	// Transports are the ways in the sandbox asked for; empty means every
	// transport the deployment backed when it was created.
	Transports []string `json:"transports"`
	// Isolation is what its receipt promised: the runtime class (gvisor),
	// or insecure-no-gvisor for a development deployment without gVisor.
	Isolation string    `json:"isolation,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SandboxList is a page of sandboxes. Next is the cursor for the following
// page (pass it as ?after=), empty on the last page.
type SandboxList struct {
	Items []Sandbox `json:"items"`
	Next  string    `json:"next,omitempty"`
}

// EventList is a sandbox's state history, oldest first.
type EventList struct {
	Items []store.Event `json:"items"`
}

// CreateKeyRequest is the body of POST /v1/keys.
type CreateKeyRequest struct {
	Name string `json:"name"`
}

// CreatedKey is a new API key. Secret is shown this once and never again.
type CreatedKey struct {
	store.APIKey
	Secret string `json:"secret"`
}

// KeyList lists an organization's keys, without secrets.
type KeyList struct {
	Items []store.APIKey `json:"items"`
}

func toAPI(sb store.Sandbox) Sandbox {
	out := Sandbox{
		ID: sb.ID, State: sb.State, Anomaly: sb.Anomaly, Reason: sb.Reason, ExitCode: sb.ExitCode, Desired: sb.DesiredMode,
		Image: sb.Spec.Image,
		Resources: Resources{CPURequest: sb.Spec.CPURequest, CPULimit: sb.Spec.CPULimit,
			MemoryRequest: sb.Spec.MemoryRequest, MemoryLimit: sb.Spec.MemoryLimit},
		ShutdownPolicy: sb.Spec.ShutdownPolicy, ExpiresAt: sb.ExpiresAt,
		Volumes: []VolumeRequest{}, Labels: map[string]string{}, Transports: transportNames(sb.Spec.Transports),
		CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt,
	}
	if r, err := sandbox.ParseReceipt(sb.Receipt); err == nil {
		out.Isolation = r.Isolation()
	}
	if sb.Spec.TTLSeconds > 0 {
		out.TTL = (time.Duration(sb.Spec.TTLSeconds) * time.Second).String()
	}
	for _, v := range sb.Spec.Volumes {
		out.Volumes = append(out.Volumes, VolumeRequest(v))
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
