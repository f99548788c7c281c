package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
)

// Vars are the values the flags' defaults name (${default_namespace},
// ${default_runtime_class}, ${default_cluster_timeout}), for the kong
// parser of a grammar that embeds Config or ClusterFlags.
func Vars() map[string]string {
	return map[string]string{"default_namespace": k8s.DefaultNamespace, "default_runtime_class": k8s.DefaultRuntimeClass,
		"default_cluster_timeout": cluster.DefaultTimeout.String()}
}

// ClusterFlags say which cluster and which boundary: serve and doctor share
// them.
type ClusterFlags struct {
	Kubeconfig     string        `default:"" env:"HILOOP_KUBECONFIG" help:"Kubeconfig file (default: in-cluster, then KUBECONFIG and ~/.kube/config)."`
	Namespace      string        `default:"${default_namespace}" env:"HILOOP_NAMESPACE" help:"Namespace that holds the sandboxes."`
	RuntimeClass   string        `default:"${default_runtime_class}" env:"HILOOP_RUNTIME_CLASS" help:"RuntimeClass every sandbox pod runs under."`
	SessionPort    int           `default:"2223" env:"HILOOP_SESSION_PORT" help:"Port the session helper listens on in each pod (the one the NetworkPolicy opens)."`
	ClusterTimeout time.Duration `default:"${default_cluster_timeout}" env:"HILOOP_CLUSTER_TIMEOUT" help:"How long to wait for the cluster at start-up and per call."`
	NoGVisor       bool          `name:"insecure-no-gvisor" env:"HILOOP_INSECURE_NO_GVISOR" help:"DEVELOPMENT ONLY (kind): run sandboxes without the gVisor runtime class. Every receipt and sandbox says so, and the self-check reports it."`
	BoundaryFile   string        `name:"boundary-file" default:"" env:"HILOOP_BOUNDARY_FILE" help:"The chart's rendering of the isolation boundary that the self-check holds the cluster to (the chart mounts it from the ConfigMap hiloop-boundary; helm template's output also works). Default: the chart's default values, built in."`

	// Expected is the boundary the self-check holds the cluster to: the
	// one BoundaryFile holds, read by Check, or one set before New (hiloop
	// dev's local cluster); nil for the chart's default, built in.
	Expected *boundary.Objects `kong:"-"`
}

// Check checks the flags, naming the flag that fails, and reads
// BoundaryFile.
func (f *ClusterFlags) Check() error {
	if f.Kubeconfig != "" {
		if _, err := os.Stat(f.Kubeconfig); err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
	}
	if !dnsLabelRE.MatchString(f.Namespace) {
		return fmt.Errorf("--namespace: %q is not a valid namespace name", f.Namespace)
	}
	if !dnsLabelRE.MatchString(f.RuntimeClass) {
		return fmt.Errorf("--runtime-class: %q is not a valid RuntimeClass name", f.RuntimeClass)
	}
	if f.SessionPort < 1 || f.SessionPort > 65535 {
		return errors.New("--session-port: must be in 1..65535")
	}
	if f.ClusterTimeout <= 0 {
		return errors.New("--cluster-timeout: must be positive")
	}
	if f.BoundaryFile != "" {
		raw, err := os.ReadFile(f.BoundaryFile)
		if err != nil {
			return fmt.Errorf("--boundary-file: %w", err)
		}
		if f.Expected, err = boundary.Parse(raw); err != nil {
			return fmt.Errorf("--boundary-file: %s is not a rendering of the hiloop chart: %w", f.BoundaryFile, err)
		}
	}
	return nil
}

// BoundaryOptions are what the isolation self-check holds the cluster to.
func (f *ClusterFlags) BoundaryOptions() boundary.Options {
	return boundary.Options{Namespace: f.Namespace, RuntimeClass: f.RuntimeClass, SessionPort: f.SessionPort, NoGVisor: f.NoGVisor,
		Expected: f.Expected}
}

// Clients loads the kubeconfig and checks the API server answers.
func (f *ClusterFlags) Clients(ctx context.Context) (*k8s.Clients, error) {
	cfg, err := k8s.LoadConfig(f.Kubeconfig)
	if err != nil {
		return nil, err
	}
	clients, err := k8s.NewClients(cfg)
	if err != nil {
		return nil, err
	}
	return clients, clients.CheckReachable(ctx, f.ClusterTimeout)
}

// Config is everything hiloop serve is told, as flags: package main's
// serve and dev commands embed it, and a test in-process parses the same
// flags (internal/e2e). Check validates it.
type Config struct {
	ClusterFlags       `embed:""`
	Listen             string              `default:"127.0.0.1:8080" env:"HILOOP_LISTEN" help:"Address of the HTTP API."`
	MetricsListen      string              `default:"" env:"HILOOP_METRICS_LISTEN" help:"Address of the Prometheus metrics endpoint (/metrics); off when empty."`
	SSHListen          string              `default:"127.0.0.1:2222" env:"HILOOP_SSH_LISTEN" help:"Address of the SSH gateway; empty turns it off."`
	SSHKeepAlive       time.Duration       `name:"ssh-keepalive" default:"15s" env:"HILOOP_SSH_KEEPALIVE" help:"How often the SSH gateway checks that a client is still there; three unanswered checks close the connection."`
	SSHIdleTimeout     time.Duration       `default:"0s" env:"HILOOP_SSH_IDLE_TIMEOUT" help:"Close an SSH connection that moved no bytes for this long (0: never)."`
	DB                 string              `default:"hiloop.db" env:"HILOOP_DB" help:"Path of the SQLite product record."`
	BootstrapKey       string              `name:"bootstrap-key-file" default:"" env:"HILOOP_BOOTSTRAP_KEY_FILE" help:"File the admin organization's first API key is written to on first start, mode 0600 (default: the --db path with .admin-key appended). The key is printed too only when stdout is a terminal."`
	StorageClasses     []string            `default:"" env:"HILOOP_STORAGE_CLASSES" help:"Storage classes volumes may name (the cluster default is always allowed)."`
	Transports         []receipt.Transport `default:"exec,ssh" env:"HILOOP_TRANSPORTS" help:"Transports this deployment backs: exec (the API's exec), ssh (shells and commands through the gateway), forward (ssh -L, through a session helper in each pod that asks for it)."`
	AgentImage         string              `default:"" env:"HILOOP_AGENT_IMAGE" help:"Image of the session helper (hiloop agent, the binary at /hiloop); required with the forward transport."`
	RateLimit          float64             `default:"100" env:"HILOOP_RATE_LIMIT" help:"Requests per second one API key may make (burst twice that); 0 turns it off."`
	CreateRateLimit    float64             `default:"20" env:"HILOOP_CREATE_RATE_LIMIT" help:"Sandbox creates per second one API key may make (burst five times that); 0 turns it off."`
	ExecPerSandbox     int                 `default:"8" env:"HILOOP_EXEC_PER_SANDBOX" help:"Most concurrent sessions (exec, ssh, files) per sandbox: each is a stream through the kubelet into one container that shares the sandbox's CPU and memory, so past a handful more make each slower (docs/api.md, Exec). GET /v1/org shows how close an organization runs."`
	ExecPerOrg         int                 `default:"32" env:"HILOOP_EXEC_PER_ORG" help:"Most concurrent sessions (exec, ssh, files) per organization; a platform that drives many sandboxes at once raises it."`
	MaxFileSize        int64               `name:"max-file-size" default:"1073741824" env:"HILOOP_MAX_FILE_SIZE" help:"Most bytes one file upload or download (PUT and GET .../files, which count as exec sessions) may move; a directory's tar stream counts whole."`
	AdminOrg           string              `default:"admin" env:"HILOOP_ADMIN_ORG" help:"Name of the organization created on first start."`
	ShutdownTimeout    time.Duration       `default:"15s" env:"HILOOP_SHUTDOWN_TIMEOUT" help:"How long to drain on SIGINT/SIGTERM."`
	LogLevel           string              `default:"info" enum:"debug,info,warn,error" env:"HILOOP_LOG_LEVEL" help:"Log level: debug, info, warn, error."`
	LogFormat          string              `default:"text" enum:"text,json" env:"HILOOP_LOG_FORMAT" help:"Log format: text or json (one object per line)."`
	EventRetention     time.Duration       `default:"720h" env:"HILOOP_EVENT_RETENTION" help:"How long sandboxes' state transitions (sandbox events) are kept; older ones are pruned hourly. 0 keeps them forever."`
	DefaultIdleTimeout time.Duration       `name:"default-idle-timeout" default:"0s" env:"HILOOP_DEFAULT_IDLE_TIMEOUT" help:"Idle timeout of a sandbox whose create names none and whose organization sets none (hiloop org idle-timeout): once nobody used it through hiloop for this long while it ran, it is stopped, and its owner's next ssh, ssh -L or exec with wake=true starts it again. 0 turns it off."`
	WakeTimeout        time.Duration       `name:"wake-timeout" default:"2m" env:"HILOOP_WAKE_TIMEOUT" help:"How long a wake waits for a sandbox stopped for idleness to run again; past it the caller is told it did not, with the sandbox's state."`
	DefaultCPULimit    string              `name:"default-cpu-limit" default:"2" env:"HILOOP_DEFAULT_CPU_LIMIT" help:"CPU limit of a sandbox whose create sets none (its request is then 10m). Every sandbox states its resources, so the sandbox namespace's quota can count them."`
	DefaultMemoryLimit string              `name:"default-memory-limit" default:"4Gi" env:"HILOOP_DEFAULT_MEMORY_LIMIT" help:"Memory limit of a sandbox whose create sets none (its request is then 16Mi)."`
	RuntimeAttestation bool                `name:"runtime-attestation" default:"true" negatable:"" env:"HILOOP_RUNTIME_ATTESTATION" help:"Check from inside each new sandbox pod that it runs under gVisor (a probe reads /proc/version through exec) and quarantine one seen outside it (runtime_not_gvisor). Off with --insecure-no-gvisor, where nothing is promised; hiloop dev turns it off unless set, since its simulated pods run commands on this host."`
	SelfCheck          time.Duration       `name:"self-check-interval" default:"1m" env:"HILOOP_SELF_CHECK_INTERVAL" help:"How often to check the cluster's isolation boundary (also checked at start); creates and starts are refused while it fails."`

	// Preview URLs (docs/api.md, "Previews"; docs/operations.md).
	PreviewDomain         string `name:"preview-domain" default:"" env:"HILOOP_PREVIEW_DOMAIN" help:"Domain, host[:port], whose subdomains serve preview URLs of sandboxes' ports (POST /v1/sandboxes/{id}/previews): requests to the --listen address with Host pv-ID.DOMAIN go to the sandbox, over the session helper as ssh -L does; needs the forward transport, a wildcard DNS record *.DOMAIN and, for https, a wildcard certificate where TLS ends. Off when empty."`
	PreviewScheme         string `name:"preview-scheme" default:"auto" enum:"auto,http,https" env:"HILOOP_PREVIEW_SCHEME" help:"Scheme of the preview URLs: https (hiloop behind a proxy that ends TLS), http, or auto: http for localhost and *.localhost (plain-HTTP development on loopback), https otherwise."`
	MaxPreviewsPerSandbox int    `name:"max-previews-per-sandbox" default:"16" env:"HILOOP_MAX_PREVIEWS_PER_SANDBOX" help:"Most live previews one sandbox may have; one more answers 409 preview_limit."`

	// Limits of the SSH gateway on what a stranger can open (docs/ssh.md,
	// "Limits").
	SSHLoginGrace           time.Duration  `name:"ssh-login-grace" default:"30s" env:"HILOOP_SSH_LOGIN_GRACE" help:"Close an SSH connection that has not authenticated this long after it was accepted, version and key exchange included (as sshd's LoginGraceTime)."`
	SSHMaxStartups          sshd.Startups  `name:"ssh-max-startups" default:"64:30:256" env:"HILOOP_SSH_MAX_STARTUPS" help:"SSH connections in their key exchange at once, start:rate:full as sshd's MaxStartups: past start, a new one waits for a place with a chance of rate percent, growing to 100 at full; one number n is n:100:n. One that arrives past full takes the place of the oldest that has sent nothing, or waits."`
	SSHMaxStartupsPerSource int            `name:"ssh-max-startups-per-source" default:"128" env:"HILOOP_SSH_MAX_STARTUPS_PER_SOURCE" help:"Most SSH connections in their key exchange from one client address (an IPv6 /64), as sshd's PerSourceMaxStartups; one more takes the place of the address's oldest that has sent nothing, or waits (--ssh-startup-queue)."`
	SSHStartupQueue         int            `name:"ssh-startup-queue" default:"256" env:"HILOOP_SSH_STARTUP_QUEUE" help:"Most SSH connections waiting for a place in the key exchanges (--ssh-max-startups); one more is refused."`
	SSHStartupWait          time.Duration  `name:"ssh-startup-wait" default:"10s" env:"HILOOP_SSH_STARTUP_WAIT" help:"How long an SSH connection waits for a place in the key exchanges, and a login for a place of its key or organization (--ssh-max-conns-per-key, --ssh-max-conns-per-org), before it is refused; less than --ssh-login-grace."`
	SSHPenalties            sshd.Penalties `name:"ssh-penalties" default:"authfail:5s,noauth:1s,grace-exceeded:10s,crash:30s,min:15s,max:10m,max-sources:16384" env:"HILOOP_SSH_PENALTIES" help:"What a client address is charged for an SSH connection that closes before it authenticates, as sshd's PerSourcePenalties: authfail (a key failed), noauth (never tried), grace-exceeded (the login grace passed), crash (broke the protocol); an address that owes min is refused until it owes nothing, at most max; max-sources addresses are tracked. off turns them off."`
	SSHMaxConnsPerKey       int            `name:"ssh-max-conns-per-key" default:"32" env:"HILOOP_SSH_MAX_CONNS_PER_KEY" help:"Most authenticated SSH connections of one SSH key at once; a login past it waits for a place (--ssh-startup-wait), then fails."`
	SSHMaxConnsPerOrg       int            `name:"ssh-max-conns-per-org" default:"256" env:"HILOOP_SSH_MAX_CONNS_PER_ORG" help:"Most authenticated SSH connections of all of one organization's SSH keys together; a login past it waits for a place (--ssh-startup-wait), then fails."`
	SSHMaxChannelsPerConn   int            `name:"ssh-max-channels-per-conn" default:"32" env:"HILOOP_SSH_MAX_CHANNELS_PER_CONN" help:"Most channels (sessions and ssh -L channels together) open at once on one SSH connection, as sshd's MaxSessions; one more is refused and the connection stays."`
	SSHMaxChannelsPerOrg    int            `name:"ssh-max-channels-per-org" default:"128" env:"HILOOP_SSH_MAX_CHANNELS_PER_ORG" help:"Most channels open at once on all of one organization's SSH connections together; one more is refused."`
	SSHHelperDialTimeout    time.Duration  `name:"ssh-helper-dial-timeout" default:"10s" env:"HILOOP_SSH_HELPER_DIAL_TIMEOUT" help:"How long the gateway gives a sandbox's session helper to accept the connection and finish the TLS handshake, to answer each stream open, and to take each frame written to it (ssh -L)."`

	// Limits of the HTTP listeners (API and metrics) on what a client can
	// hold before a handler sees its request, or while the server waits on
	// it (docs/api.md, "Rate limits and key limits").
	HTTPIOTimeout               time.Duration `name:"http-io-timeout" default:"1m" env:"HILOOP_HTTP_IO_TIMEOUT" help:"How long a request's body may go without a byte, and take to arrive once hiloop starts reading it (plus a second per 16 KiB it brings), and how long one write of an answer may wait for the client to take it; past any of them the connection is closed."`
	HTTPMaxHeaderReads          int           `name:"http-max-header-reads" default:"256" env:"HILOOP_HTTP_MAX_HEADER_READS" help:"Most HTTP connections reading a request's headers over more than one read at once (each may hold up to 512 KiB of them for up to 10s before any key is checked; a request whose headers come in one read holds no place); one more is closed."`
	HTTPMaxHeaderReadsPerSource int           `name:"http-max-header-reads-per-source" default:"32" env:"HILOOP_HTTP_MAX_HEADER_READS_PER_SOURCE" help:"The same, per client address (an IPv6 /64)."`

	// Limits of the API that no caller can multiply by making keys or
	// tokens (docs/api.md, "Rate limits").
	OrgRateLimit       float64 `name:"org-rate-limit" default:"200" env:"HILOOP_ORG_RATE_LIMIT" help:"Requests per second all of one organization's API keys may make together (burst twice that); 0 turns it off."`
	OrgCreateRateLimit float64 `name:"org-create-rate-limit" default:"40" env:"HILOOP_ORG_CREATE_RATE_LIMIT" help:"Sandbox creates per second all of one organization's API keys may make together (burst five times that); 0 turns it off."`
	AddressRateLimit   float64 `name:"address-rate-limit" default:"10" env:"HILOOP_ADDRESS_RATE_LIMIT" help:"Requests per second one client address (an IPv6 /64) may make without a valid API key: a missing, unknown or revoked token, and the OpenAPI document (burst twice that; the probes /healthz and /readyz are not limited); 0 turns it off."`
	MaxAPIKeysPerOrg   int     `name:"max-api-keys-per-org" default:"100" env:"HILOOP_MAX_API_KEYS_PER_ORG" help:"Most live API keys one organization may have; creating one more through the API answers 409 key_limit."`
	MaxSSHKeysPerOrg   int     `name:"max-ssh-keys-per-org" default:"100" env:"HILOOP_MAX_SSH_KEYS_PER_ORG" help:"Most SSH keys one organization may register; one more answers 409 key_limit."`
	// Every waiting wake holds a goroutine and its caller's connection for
	// up to --wake-timeout (docs/api.md, "Idle stop and wake").
	MaxWaitingWakesPerKey int `name:"max-waiting-wakes-per-key" default:"16" env:"HILOOP_MAX_WAITING_WAKES_PER_KEY" help:"Most calls of one API or SSH key that may wait at once for a sandbox to wake (ssh, ssh -L channels, exec and file calls with wake=true on a sandbox not running yet); one more answers 429 too_many_waits, or the gateway refuses it."`
	MaxWaitingWakesPerOrg int `name:"max-waiting-wakes-per-org" default:"64" env:"HILOOP_MAX_WAITING_WAKES_PER_ORG" help:"Most calls of all of one organization's keys together that may wait at once for a sandbox to wake; one more is refused the same way."`

	// LocalHelpers says the session helpers run as local processes of this
	// binary or from its image (hiloop dev), so the forward transport needs
	// no --agent-image.
	LocalHelpers bool `kong:"-"`
}

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// bootstrapKeyFile is where the first admin key is written.
func (s *Config) bootstrapKeyFile() string {
	if s.BootstrapKey != "" {
		return s.BootstrapKey
	}
	return s.DB + ".admin-key"
}

// Check checks the flags, naming the flag that fails (serve's Validate,
// which kong reports with exit 2).
func (s *Config) Check() error {
	for _, check := range []func() error{
		s.checkListeners,
		func() error {
			if s.DB == "" {
				return errors.New("--db: must not be empty")
			}
			return nil
		},
		s.ClusterFlags.Check,
		s.checkTransports,
		s.checkSandboxDefaults,
		s.checkPreviews,
		s.checkDefaultLimits,
		s.checkServerLimits,
		s.validateSSHLimits,
		s.validateAPILimits,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkListeners checks the addresses hiloop listens on and the SSH
// gateway's keep-alive and idle timeout.
func (s *Config) checkListeners() error {
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		return fmt.Errorf("--listen: %q is not host:port", s.Listen)
	}
	if s.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(s.MetricsListen); err != nil {
			return fmt.Errorf("--metrics-listen: %q is not host:port", s.MetricsListen)
		}
	}
	if s.SSHListen != "" {
		if _, _, err := net.SplitHostPort(s.SSHListen); err != nil {
			return fmt.Errorf("--ssh-listen: %q is not host:port", s.SSHListen)
		}
	}
	if s.SSHKeepAlive <= 0 {
		return errors.New("--ssh-keepalive: must be positive")
	}
	if s.SSHIdleTimeout < 0 {
		return errors.New("--ssh-idle-timeout: must not be negative")
	}
	return nil
}

// checkTransports checks the admin organization's name and that every
// transport offered is known and has what it needs to run.
func (s *Config) checkTransports() error {
	if !dnsLabelRE.MatchString(s.AdminOrg) {
		return fmt.Errorf("--admin-org: %q is not a lower-case DNS label", s.AdminOrg)
	}
	for _, t := range s.Transports {
		if !t.Known() {
			return fmt.Errorf("--transports: unknown transport %q (known: exec, ssh, forward)", t)
		}
	}
	if slices.Contains(s.Transports, receipt.TransportForward) && s.AgentImage == "" && !s.LocalHelpers {
		return errors.New("--agent-image: the forward transport needs the session helper's image")
	}
	if slices.Contains(s.Transports, receipt.TransportSSH) && s.SSHListen == "" {
		return errors.New("--transports: ssh needs the gateway (--ssh-listen)")
	}
	return nil
}

// checkSandboxDefaults checks the request rates, event retention and the
// idle and wake timeouts.
func (s *Config) checkSandboxDefaults() error {
	if s.RateLimit < 0 || s.CreateRateLimit < 0 {
		return errors.New("--rate-limit, --create-rate-limit: must not be negative")
	}
	if s.EventRetention < 0 {
		return errors.New("--event-retention: must not be negative")
	}
	if control.CheckIdleTimeout(s.DefaultIdleTimeout) != nil {
		return fmt.Errorf("--default-idle-timeout: must be 0 (off) or from %s to %s", control.MinIdleTimeout, control.MaxTTL)
	}
	if s.WakeTimeout <= 0 {
		return errors.New("--wake-timeout: must be positive")
	}
	return nil
}

// checkDefaultLimits checks the CPU and memory limits given to sandboxes
// whose requests name none.
func (s *Config) checkDefaultLimits() error {
	for flag, v := range map[string]string{"--default-cpu-limit": s.DefaultCPULimit, "--default-memory-limit": s.DefaultMemoryLimit} {
		if q, err := resource.ParseQuantity(v); err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%s: %q is not a positive quantity", flag, v)
		}
	}
	return nil
}

// checkServerLimits checks the server's own intervals, exec sessions,
// file sizes and HTTP read limits.
func (s *Config) checkServerLimits() error {
	if s.SelfCheck < time.Second {
		return errors.New("--self-check-interval: must be at least 1s")
	}
	if s.ExecPerSandbox < 1 {
		return errors.New("--exec-per-sandbox: must be at least 1")
	}
	if s.ExecPerOrg < 1 {
		return errors.New("--exec-per-org: must be at least 1")
	}
	if s.ShutdownTimeout <= 0 {
		return errors.New("--shutdown-timeout: must be positive")
	}
	if s.MaxFileSize < 1 {
		return errors.New("--max-file-size: must be at least 1")
	}
	if s.HTTPIOTimeout <= 0 {
		return errors.New("--http-io-timeout: must be positive")
	}
	if s.HTTPMaxHeaderReads < 1 {
		return errors.New("--http-max-header-reads: must be at least 1")
	}
	if s.HTTPMaxHeaderReadsPerSource < 1 {
		return errors.New("--http-max-header-reads-per-source: must be at least 1")
	}
	return nil
}

// validateAPILimits checks the limits per organization and per address.
func (s *Config) validateAPILimits() error {
	if s.OrgRateLimit < 0 || s.OrgCreateRateLimit < 0 || s.AddressRateLimit < 0 {
		return errors.New("--org-rate-limit, --org-create-rate-limit, --address-rate-limit: must not be negative")
	}
	if s.MaxAPIKeysPerOrg < 1 {
		return errors.New("--max-api-keys-per-org: must be at least 1")
	}
	if s.MaxSSHKeysPerOrg < 1 {
		return errors.New("--max-ssh-keys-per-org: must be at least 1")
	}
	if s.MaxWaitingWakesPerKey < 1 {
		return errors.New("--max-waiting-wakes-per-key: must be at least 1")
	}
	if s.MaxWaitingWakesPerOrg < 1 {
		return errors.New("--max-waiting-wakes-per-org: must be at least 1")
	}
	return nil
}

// validateSSHLimits checks the gateway's limits. Zero is refused with the
// rest: a zero limit would refuse every connection, or none.
func (s *Config) validateSSHLimits() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--ssh-login-grace", s.SSHLoginGrace}, {"--ssh-helper-dial-timeout", s.SSHHelperDialTimeout}, {"--ssh-startup-wait", s.SSHStartupWait}} {
		if d.v <= 0 {
			return fmt.Errorf("%s: must be positive", d.flag)
		}
	}
	if s.SSHStartupWait >= s.SSHLoginGrace {
		return errors.New("--ssh-startup-wait: must be less than --ssh-login-grace")
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"--ssh-max-startups-per-source", s.SSHMaxStartupsPerSource}, {"--ssh-startup-queue", s.SSHStartupQueue}, {"--ssh-max-conns-per-key", s.SSHMaxConnsPerKey}, {"--ssh-max-conns-per-org", s.SSHMaxConnsPerOrg}, {"--ssh-max-channels-per-conn", s.SSHMaxChannelsPerConn}, {"--ssh-max-channels-per-org", s.SSHMaxChannelsPerOrg}} {
		if n.v < 1 {
			return fmt.Errorf("%s: must be at least 1", n.flag)
		}
	}
	return nil
}

// checkPreviews checks the preview flags.
func (s *Config) checkPreviews() error {
	if s.MaxPreviewsPerSandbox < 1 {
		return errors.New("--max-previews-per-sandbox: must be at least 1")
	}
	if s.PreviewDomain == "" {
		return nil
	}
	host := s.PreviewDomain
	if h, port, err := net.SplitHostPort(host); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("--preview-domain: %q has no valid port", s.PreviewDomain)
		}
		host = h
	}
	for _, label := range strings.Split(host, ".") {
		if !dnsLabelRE.MatchString(label) {
			return fmt.Errorf("--preview-domain: %q is not a lower-case domain name, host[:port]", s.PreviewDomain)
		}
	}
	if !slices.Contains(s.Transports, receipt.TransportForward) {
		return errors.New("--preview-domain: previews reach sandboxes over the forward transport (--transports ...,forward)")
	}
	return nil
}

// PreviewURLScheme is the scheme of the preview URLs: --preview-scheme,
// or for auto, http for a localhost domain and https otherwise.
func (s *Config) PreviewURLScheme() string {
	if s.PreviewScheme != "auto" {
		return s.PreviewScheme
	}
	host := s.PreviewDomain
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return "http"
	}
	return "https"
}
