package api

import "time"

// State is a sandbox's observed state; docs/states.md says what each means
// and which follow which.
type State string

// The states a sandbox can be in.
const (
	StatePending     State = "pending"
	StateStarting    State = "starting"
	StateRunning     State = "running"
	StateStopping    State = "stopping"
	StateStopped     State = "stopped"
	StateExited      State = "exited"
	StateExpired     State = "expired"
	StateDeleted     State = "deleted"
	StateLost        State = "lost"
	StateAttention   State = "attention"
	StateQuarantined State = "quarantined"
	StateFailed      State = "failed"
)

// States lists every state.
var States = []State{StatePending, StateStarting, StateRunning, StateStopping, StateStopped, StateExited,
	StateExpired, StateDeleted, StateLost, StateAttention, StateQuarantined, StateFailed}

// Mode is what the API was last asked for.
type Mode string

// Desired modes.
const (
	ModeRunning Mode = "running"
	ModeStopped Mode = "stopped"
	ModeDeleted Mode = "deleted"
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
	// IdleTimeout stops the sandbox once nobody used it through hiloop for
	// this long, as a Go duration ("30m"); "0" never does. Empty takes the
	// organization's default, else the deployment's. A sandbox stopped for
	// idleness is woken by its owner's next ssh, ssh -L, or exec or file
	// call with ?wake=true.
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// Env is the workload container's environment beside the image's, as
	// plain values (never a reference to a Secret): every process in the
	// sandbox, an exec's too, sees it. Names are letters, digits and _,
	// not starting with a digit or with HILOOP_; at most 64, and 32 KiB in
	// all. It is returned by every read of the sandbox.
	Env map[string]string `json:"env,omitempty"`
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

// UpdateSandboxRequest is the body of PATCH /v1/sandboxes/{id}; it sets
// at least one of its fields.
type UpdateSandboxRequest struct {
	// TTL sets the expiry to now plus this duration: it extends or shortens
	// the sandbox's life.
	TTL string `json:"ttl,omitempty"`
	// IdleTimeout sets the idle timeout, as a Go duration; "0" turns idle
	// stop off. The idle clock keeps running from the last use.
	IdleTimeout string `json:"idle_timeout,omitempty"`
}

// Who stopped a sandbox, as Sandbox.StoppedBy says.
const (
	// StoppedByUser: the API's stop (POST .../stop). Only a start undoes it.
	StoppedByUser = "user"
	// StoppedByIdle: nobody used it for its idle timeout. Its owner's next
	// use wakes it.
	StoppedByIdle = "idle"
	// StoppedByTTL: its TTL passed (state expired).
	StoppedByTTL = "ttl"
	// StoppedByOutside: its mode was changed outside hiloop.
	StoppedByOutside = "outside"
)

// Sandbox is a sandbox as the API shows it, computed from the record only.
type Sandbox struct {
	ID string `json:"id"`
	// State is the observed state (see docs/states.md).
	State State `json:"state"`
	// Anomaly names the contradiction behind attention or quarantined.
	Anomaly string `json:"anomaly,omitempty"`
	// Reason says more about the state, when there is more to say.
	Reason string `json:"reason,omitempty"`
	// ExitCode is the workload's exit code once it exited.
	ExitCode *int `json:"exit_code,omitempty"`
	// Desired is what the API was last asked for: running, stopped, deleted.
	Desired        Mode              `json:"desired"`
	Image          string            `json:"image"`
	Resources      Resources         `json:"resources"`
	TTL            string            `json:"ttl,omitempty"`
	ShutdownPolicy string            `json:"shutdown_policy"`
	ExpiresAt      *time.Time        `json:"expires_at,omitempty"`
	Volumes        []VolumeRequest   `json:"volumes"`
	Labels         map[string]string `json:"labels"`
	// Env is the environment it was created with.
	Env map[string]string `json:"env"`
	// Transports are the ways in the sandbox asked for; empty means every
	// transport the deployment backed when it was created.
	Transports []string `json:"transports"`
	// Isolation is what its receipt promised: the runtime class (gvisor),
	// or insecure-no-gvisor for a development deployment without gVisor.
	Isolation string `json:"isolation,omitempty"`
	// RuntimeObserved is what hiloop saw from inside the sandbox's latest
	// attested pod (runtime attestation), beside the promise of Isolation:
	// gvisor, not-gvisor (the sandbox is then quarantined,
	// runtime_not_gvisor, for as long as that pod lives) or unknown (no
	// probe could read /proc/version: an image without cat or sh). Absent
	// before the first pod is attested, and when the deployment does not
	// attest.
	RuntimeObserved string `json:"runtime_observed,omitempty"`
	// KernelRelease is the kernel release that attestation read there
	// (4.19.0-gvisor under gVisor, the host's under any other runtime), at
	// most 64 characters; absent when runtime_observed is unknown or
	// absent.
	KernelRelease string `json:"kernel_release,omitempty"`
	// IdleTimeout is how long it may go unused while running before it is
	// stopped; "0s" when never.
	IdleTimeout string `json:"idle_timeout"`
	// LastActivityAt is when its idle clock last started: the end of the
	// last exec, ssh session or -L channel, a touch or file call, or the
	// moment it came up running. It is written coarsely (at the start and
	// end of a use, at most every 30 seconds in between).
	LastActivityAt time.Time `json:"last_activity_at"`
	// StoppedBy says who stopped it while it is stopping, stopped or
	// expired: user, idle, ttl or outside (StoppedBy* constants).
	StoppedBy string    `json:"stopped_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SandboxList is a page of sandboxes. Next is the cursor for the following
// page (pass it as ?after=), empty on the last page.
type SandboxList struct {
	Items []Sandbox `json:"items"`
	Next  string    `json:"next,omitempty"`
}

// Event is one change of a sandbox's state.
type Event struct {
	Seq  int64     `json:"seq"`
	At   time.Time `json:"at"`
	From State     `json:"from"`
	To   State     `json:"to"`
	// Reason says why, when there is more to say.
	Reason string `json:"reason,omitempty"`
}

// EventList is a sandbox's state history, oldest first.
type EventList struct {
	Items []Event `json:"items"`
}

// Org is the caller's organization and its quotas.
type Org struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	MaxSandboxes int    `json:"max_sandboxes"`
	MaxRunning   int    `json:"max_running"`
	// IdleTimeout is the idle timeout its sandboxes get when their create
	// names none; empty when it takes the deployment's default.
	IdleTimeout string    `json:"idle_timeout,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	// Sessions is what the organization has open against the session
	// limits, now; GET /v1/org fills it.
	Sessions *OrgSessions `json:"sessions,omitempty"`
}

// OrgSessions is an organization's live sessions (exec, ssh, files)
// against the deployment's limits: a session past either is refused
// (429 exec_limit, or an SSH session that says so).
type OrgSessions struct {
	// Open counts the organization's live sessions, against MaxPerOrg.
	Open      int `json:"open"`
	MaxPerOrg int `json:"max_per_org"`
	// BusiestSandbox counts the live sessions of its sandbox that has the
	// most, against MaxPerSandbox.
	BusiestSandbox int `json:"busiest_sandbox"`
	MaxPerSandbox  int `json:"max_per_sandbox"`
}

// APIKey is an API key, without its secret.
type APIKey struct {
	ID        string     `json:"id"`
	OrgID     string     `json:"org_id"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// CreateKeyRequest is the body of POST /v1/keys.
type CreateKeyRequest struct {
	Name string `json:"name"`
}

// CreatedKey is a new API key. Secret is shown this once and never again.
type CreatedKey struct {
	APIKey
	Secret string `json:"secret"`
}

// KeyList lists an organization's keys, without secrets.
type KeyList struct {
	Items []APIKey `json:"items"`
}

// SSHKey is a registered SSH public key.
type SSHKey struct {
	ID          string    `json:"id"`
	OrgID       string    `json:"org_id"`
	Name        string    `json:"name"`
	Fingerprint string    `json:"fingerprint"`
	PublicKey   string    `json:"public_key"`
	CreatedAt   time.Time `json:"created_at"`
}

// AddSSHKeyRequest is the body of POST /v1/ssh-keys.
type AddSSHKeyRequest struct {
	// PublicKey is one line of authorized_keys form ("ssh-ed25519 AAAA...
	// comment"). Certificates are refused; RSA keys need 2048 bits.
	PublicKey string `json:"public_key"`
	// Name is a label; the key's comment when empty.
	Name string `json:"name,omitempty"`
}

// SSHKeyList lists an organization's SSH keys.
type SSHKeyList struct {
	Items []SSHKey `json:"items"`
}

// HostKey is the SSH gateway's host key, for clients to pin.
type HostKey struct {
	// PublicKey is in authorized_keys form ("ssh-ed25519 AAAA...").
	PublicKey string `json:"public_key"`
	// Fingerprint is its SHA256 fingerprint, as ssh prints it.
	Fingerprint string `json:"fingerprint"`
	// Port is the gateway's port; 0 when the gateway is off.
	Port int `json:"port"`
}

// Preview auth modes (CreatePreviewRequest.Auth).
const (
	// PreviewAuthToken: the URL carries a token of the preview's own.
	PreviewAuthToken = "token"
	// PreviewAuthKey: a visitor presents an API key of the organization.
	PreviewAuthKey = "key"
)

// CreatePreviewRequest is the body of POST /v1/sandboxes/{id}/previews:
// serve a port of the sandbox at a URL on the deployment's preview domain.
type CreatePreviewRequest struct {
	// Port is the TCP port, on the sandbox's loopback, to serve.
	Port int `json:"port"`
	// Auth is who may visit: "token" (the default) for anyone holding the
	// URL's token, "key" for a caller with an API key of the organization.
	Auth string `json:"auth,omitempty"`
	// TTL is how long the preview works, as a Go duration ("90m"); 24h
	// when empty, from 1s to 720h.
	TTL string `json:"ttl,omitempty"`
}

// Preview is one preview URL of a sandbox's port.
type Preview struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
	Auth      string `json:"auth"`
	// URL is where the port is served. The answer to a create of a token
	// preview carries the token in it (and in Token), and only that
	// answer: the record keeps the token's hash.
	URL string `json:"url"`
	// Token is the preview's token, in the answer to its create only.
	Token     string    `json:"token,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// PreviewList is the answer of GET /v1/sandboxes/{id}/previews: the live
// previews, oldest first.
type PreviewList struct {
	Items []Preview `json:"items"`
}
