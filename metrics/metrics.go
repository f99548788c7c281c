// Package metrics holds hiloop's Prometheus metrics: one registry, made in
// main and handed to each component through its Options. A nil *Metrics is
// valid and records nothing, so components and their tests need none.
// Label values are bounded: route patterns, codes, states, verbs, kinds,
// never sandbox, key or organization ids.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/hiloop/hiloop/receipt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are hiloop's collectors.
type Metrics struct {
	reg *prometheus.Registry

	requests       *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	authFailures   *prometheus.CounterVec
	clusterErrors  *prometheus.CounterVec
	mirrorQueue    prometheus.Gauge
	mirrorLag      prometheus.Histogram
	sessionBytes   *prometheus.CounterVec
	selfCheck      *prometheus.GaugeVec
	foreign        prometheus.Gauge
	sshRefused     *prometheus.CounterVec
	sshPenalties   *prometheus.CounterVec
	sshStartups    *prometheus.GaugeVec
	httpRefused    *prometheus.CounterVec
	sessionRefused *prometheus.CounterVec
	idleStops      prometheus.Counter
	wakes          *prometheus.CounterVec
	wakeTime       prometheus.Histogram
	wakeWaits      prometheus.Gauge
	wakeRefused    *prometheus.CounterVec
	attestations   *prometheus.CounterVec
}

// Source answers the gauges that are read at scrape time.
type Source interface {
	// SandboxesByState counts sandboxes by state, and organizations.
	SandboxesByState(ctx context.Context) (map[string]int, int, error)
	// Sessions counts live sessions by transport.
	SessionsByTransport() map[receipt.Transport]int
	// SessionsBusiest counts the live sessions of the sandbox and of the
	// organization that have the most; SessionLimits are the limits they
	// count against.
	SessionsBusiest() (sandbox, org int)
	SessionLimits() (perSandbox, perOrg int)
}

// New makes the registry with Go and process collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_api_requests_total",
		Help: "API requests by route pattern, method and status code."}, []string{"route", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hiloop_api_request_duration_seconds",
		Help: "API request latency by route pattern.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"route"})
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_auth_failures_total",
		Help: "Authentication failures by kind: api_key_missing, api_key_invalid, ssh_key_refused."}, []string{"kind"})
	m.clusterErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_cluster_errors_total",
		Help: "Failed cluster calls by verb (create, patch, delete, get, exec) and kind (unavailable, rejected, forbidden, quota)."}, []string{"verb", "kind"})
	m.mirrorQueue = prometheus.NewGauge(prometheus.GaugeOpts{Name: "hiloop_mirror_queue_depth",
		Help: "Sandboxes waiting in the status mirror's queue."})
	m.mirrorLag = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hiloop_mirror_lag_seconds",
		Help: "From a cluster event to the record write it caused.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})
	m.sessionBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_session_bytes_total",
		Help: "Bytes moved by sessions, by transport (exec, ssh, forward) and direction (in to the sandbox, out of it)."}, []string{"transport", "direction"})
	m.selfCheck = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hiloop_self_check",
		Help: "The isolation self-check, per boundary object: 1 holds, 0 fails, 0.5 fails in a way the deployment allows (--insecure-no-gvisor)."}, []string{"check", "object"})
	m.foreign = prometheus.NewGauge(prometheus.GaugeOpts{Name: "hiloop_foreign_sandboxes",
		Help: "Sandboxes in the sandbox namespace without hiloop's label, which hiloop did not make and does not mirror, as the last self-check found them (at most 500)."})
	m.sshRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_ssh_refused_connections_total",
		Help: "SSH connections the gateway closed or refused at a limit, by reason: startups (too many in their key exchange and waiting for one), startups_per_source (too many not yet authenticated from one address), startup_wait (waited for a place in the key exchanges and got none in time), silent (sent nothing, and its place went to a new connection), penalty (from an address penalised for failed or stalled logins), login_grace (not authenticated in time), per_key (too many of one key), per_org (too many of one organization's keys), channels_per_conn (a session or ssh -L channel refused: its connection had too many open), channels_per_org (the same: its organization's connections had too many open together), helper_dial_timeout (an ssh -L channel refused: the session helper did not connect and finish its handshake in time)."}, []string{"reason"})
	m.sshPenalties = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_ssh_penalties_total",
		Help: "SSH connections that closed before they authenticated and charged their source address a penalty, by what they did: authfail (a key or method failed), noauth (closed without trying), grace_exceeded (the login grace passed), crash (the handshake broke the protocol)."}, []string{"event"})
	m.sshStartups = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hiloop_ssh_startups",
		Help: "SSH connections not yet authenticated, by state: handshake (in the version and key exchange or authentication, against --ssh-max-startups), waiting (for a place among them, against --ssh-startup-queue)."}, []string{"state"})
	m.httpRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_http_refused_connections_total",
		Help: "HTTP connections (API and metrics) closed as they started a request, at a limit, by reason: header_reads (too many reading request headers at once), header_reads_per_source (from one address)."}, []string{"reason"})
	m.sessionRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_sessions_refused_total",
		Help: "Sessions (exec, ssh, files) refused at a session limit, by limit: sandbox (--exec-per-sandbox), organization (--exec-per-org)."}, []string{"limit"})
	m.idleStops = prometheus.NewCounter(prometheus.CounterOpts{Name: "hiloop_idle_stops_total",
		Help: "Sandboxes stopped because nobody used them through hiloop for their idle timeout."})
	m.wakes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_wakes_total",
		Help: "Sandboxes stopped for idleness that their owner's use started again, by what woke them: ssh (a session), forward (an ssh -L channel), exec (exec with wake=true), files (a file call with wake=true). Concurrent wakes of one sandbox count once."}, []string{"trigger"})
	m.wakeTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hiloop_wake_duration_seconds",
		Help: "From the start of a wake to the sandbox running.", Buckets: prometheus.ExponentialBuckets(0.125, 2, 12)})
	m.wakeWaits = prometheus.NewGauge(prometheus.GaugeOpts{Name: "hiloop_wake_waits",
		Help: "Calls waiting now for a sandbox to wake (ssh, ssh -L channels, exec and file calls with wake=true), bounded per key and per organization."})
	m.wakeRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_wake_waits_refused_total",
		Help: "Calls that would have waited for a sandbox to wake, refused at a bound (429 too_many_waits, or the gateway's refusal), by trigger (ssh, forward, exec, files) and limit: per_key (too many of one key waiting), per_org (too many of one organization's keys waiting together)."}, []string{"trigger", "limit"})
	m.attestations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hiloop_runtime_attestations_total",
		Help: "Runtime attestations (a probe that reads /proc/version inside each new sandbox pod, --runtime-attestation), by result: gvisor, not-gvisor (the pod is quarantined, runtime_not_gvisor), unknown (no probe ran or it printed no kernel's line)."}, []string{"result"})
	m.reg.MustRegister(m.requests, m.latency, m.authFailures, m.clusterErrors, m.mirrorQueue, m.mirrorLag, m.sessionBytes, m.selfCheck, m.foreign, m.sshRefused, m.sshPenalties, m.sshStartups, m.httpRefused, m.sessionRefused,
		m.idleStops, m.wakes, m.wakeTime, m.wakeWaits, m.wakeRefused, m.attestations,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Watch registers the gauges read from src at scrape time.
func (m *Metrics) Watch(src Source) {
	if m == nil {
		return
	}
	m.reg.MustRegister(&sourceCollector{src: src,
		sandboxes: prometheus.NewDesc("hiloop_sandboxes", "Sandboxes in the record by state.", []string{"state"}, nil),
		orgs:      prometheus.NewDesc("hiloop_organizations", "Organizations in the record.", nil, nil),
		sessions:  prometheus.NewDesc("hiloop_sessions", "Live sessions by transport (exec, ssh, forward).", []string{"transport"}, nil),
		busiest: prometheus.NewDesc("hiloop_sessions_busiest",
			"Live sessions (exec, ssh, files) of the sandbox and of the organization that have the most, by scope (sandbox, organization), against hiloop_session_limit; GET /v1/org shows an organization its own.", []string{"scope"}, nil),
		limits: prometheus.NewDesc("hiloop_session_limit",
			"The most live sessions per sandbox (--exec-per-sandbox) and per organization (--exec-per-org).", []string{"scope"}, nil),
	})
}

type sourceCollector struct {
	src                                        Source
	sandboxes, orgs, sessions, busiest, limits *prometheus.Desc
}

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandboxes
	ch <- c.orgs
	ch <- c.sessions
	ch <- c.busiest
	ch <- c.limits
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if byState, orgs, err := c.src.SandboxesByState(ctx); err == nil {
		for st, n := range byState {
			ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(n), st)
		}
		ch <- prometheus.MustNewConstMetric(c.orgs, prometheus.GaugeValue, float64(orgs))
	}
	for t, n := range c.src.SessionsByTransport() {
		ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(n), string(t))
	}
	sandbox, org := c.src.SessionsBusiest()
	ch <- prometheus.MustNewConstMetric(c.busiest, prometheus.GaugeValue, float64(sandbox), "sandbox")
	ch <- prometheus.MustNewConstMetric(c.busiest, prometheus.GaugeValue, float64(org), "organization")
	perSandbox, perOrg := c.src.SessionLimits()
	ch <- prometheus.MustNewConstMetric(c.limits, prometheus.GaugeValue, float64(perSandbox), "sandbox")
	ch <- prometheus.MustNewConstMetric(c.limits, prometheus.GaugeValue, float64(perOrg), "organization")
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Request records one API request.
func (m *Metrics) Request(route string, code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

// AuthFailure records a failed authentication of the given kind.
func (m *Metrics) AuthFailure(kind string) {
	if m == nil {
		return
	}
	m.authFailures.WithLabelValues(kind).Inc()
}

// ClusterError records a failed cluster call.
func (m *Metrics) ClusterError(verb, kind string) {
	if m == nil {
		return
	}
	m.clusterErrors.WithLabelValues(verb, kind).Inc()
}

// SelfCheck records one self-check finding; the labels name a fixed set of
// boundary objects.
func (m *Metrics) SelfCheck(check, object string, ok, allowed bool) {
	if m == nil {
		return
	}
	v := 0.0
	switch {
	case ok:
		v = 1
	case allowed:
		v = 0.5
	}
	m.selfCheck.WithLabelValues(check, object).Set(v)
}

// ForeignSandboxes sets how many Sandboxes hiloop did not make the last
// self-check found.
func (m *Metrics) ForeignSandboxes(n int) {
	if m == nil {
		return
	}
	m.foreign.Set(float64(n))
}

// MirrorQueue sets the mirror's queue depth.
func (m *Metrics) MirrorQueue(n int) {
	if m == nil {
		return
	}
	m.mirrorQueue.Set(float64(n))
}

// MirrorLag records the time from a cluster event to its record write.
func (m *Metrics) MirrorLag(d time.Duration) {
	if m == nil {
		return
	}
	m.mirrorLag.Observe(d.Seconds())
}

// SessionBytes counts bytes a session moved.
func (m *Metrics) SessionBytes(transport, direction string, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.sessionBytes.WithLabelValues(transport, direction).Add(float64(n))
}

// SSHRefused records an SSH connection the gateway closed or refused at one
// of its limits; reason is one of a fixed set (see the metric's help).
func (m *Metrics) SSHRefused(reason string) {
	if m == nil {
		return
	}
	m.sshRefused.WithLabelValues(reason).Inc()
}

// SessionRefused records a session refused at a session limit; limit is
// sandbox or organization.
func (m *Metrics) SessionRefused(limit string) {
	if m == nil {
		return
	}
	m.sessionRefused.WithLabelValues(limit).Inc()
}

// SSHStartups sets the SSH connections not yet authenticated: in their
// handshake, and waiting for a place.
func (m *Metrics) SSHStartups(handshake, waiting int) {
	if m == nil {
		return
	}
	m.sshStartups.WithLabelValues("handshake").Set(float64(handshake))
	m.sshStartups.WithLabelValues("waiting").Set(float64(waiting))
}

// SSHPenalty records an SSH connection that charged its source a penalty;
// event is one of a fixed set (see the metric's help).
func (m *Metrics) SSHPenalty(event string) {
	if m == nil {
		return
	}
	m.sshPenalties.WithLabelValues(event).Inc()
}

// HTTPRefused records an HTTP connection closed at one of the limits on
// connections reading request headers; reason is one of a fixed set (see
// the metric's help).
func (m *Metrics) HTTPRefused(reason string) {
	if m == nil {
		return
	}
	m.httpRefused.WithLabelValues(reason).Inc()
}

// IdleStop records a sandbox stopped for idleness.
func (m *Metrics) IdleStop() {
	if m == nil {
		return
	}
	m.idleStops.Inc()
}

// Attestation records a runtime attestation's result (receipt.Runtime).
func (m *Metrics) Attestation(result receipt.Runtime) {
	if m == nil {
		return
	}
	m.attestations.WithLabelValues(string(result)).Inc()
}

// Wake records a wake that started a sandbox; trigger is one of a fixed
// set (see the metric's help).
func (m *Metrics) Wake(trigger string) {
	if m == nil {
		return
	}
	m.wakes.WithLabelValues(trigger).Inc()
}

// WakeTime records how long a wake took to bring its sandbox up.
func (m *Metrics) WakeTime(d time.Duration) {
	if m == nil {
		return
	}
	m.wakeTime.Observe(d.Seconds())
}

// WakeWaiting adds delta to the calls waiting for a sandbox to wake.
func (m *Metrics) WakeWaiting(delta int) {
	if m == nil {
		return
	}
	m.wakeWaits.Add(float64(delta))
}

// WakeWaitRefused records a call refused at a bound of the calls waiting
// for a sandbox to wake; trigger and limit are of fixed sets (see the
// metric's help).
func (m *Metrics) WakeWaitRefused(trigger, limit string) {
	if m == nil {
		return
	}
	m.wakeRefused.WithLabelValues(trigger, limit).Inc()
}
