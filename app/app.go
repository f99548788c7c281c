// Package app is one whole hiloop serve, wired from its parts: the record
// (store), the core (control), the status mirror (mirror), the SSH gateway
// (sshd), the HTTP API (server) and the metrics endpoint, over the cluster
// adapter (k8s). New binds every listener and builds every part, Run runs
// them; package main's serve and dev call it, and so does a test that runs
// a whole hiloop in-process on 127.0.0.1:0 (internal/e2e). It prints no
// banner: New returns the bound addresses as values.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/mirror"
	"github.com/hiloop/hiloop/server"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
)

// Options configure New.
type Options struct {
	// Config is what serve was told; New checks it (Config.Check).
	Config Config
	// Log is where every part logs; required.
	Log *slog.Logger
	// Stdout is where the first admin key is shown, when it is a terminal,
	// and the --insecure-no-gvisor warning; io.Discard when nil.
	Stdout io.Writer
	// Extra, when set, runs beside the parts until they stop (the local
	// session helpers of hiloop dev's simulated node).
	Extra func(ctx context.Context, log *slog.Logger) error
}

// Addrs are the addresses an App's listeners are bound to, as host:port;
// "" for a listener turned off. They are also the document serve's
// --addr-file holds (docs/operations.md).
type Addrs struct {
	// API is the HTTP API's (http://API/v1/...).
	API string `json:"api"`
	// SSH is the SSH gateway's.
	SSH string `json:"ssh,omitempty"`
	// Metrics is the metrics endpoint's (http://Metrics/metrics).
	Metrics string `json:"metrics,omitempty"`
}

// App is one whole hiloop serve: its listeners bound and every part built,
// not yet running. New builds it, Run runs it; building is apart from
// running, so a failure to start leaves nothing running.
type App struct {
	cfg Config
	log *slog.Logger

	// Listeners, bound first so a port in use fails before anything starts.
	// metricsLn and sshLn are nil when turned off.
	ln, metricsLn, sshLn net.Listener
	addrs                Addrs

	clients *k8s.Clients
	met     *metrics.Metrics
	db      *store.Store
	core    *control.Control
	mirror  *mirror.Mirror
	gateway *sshd.Gateway // nil without sshLn and previews
	hostKey gossh.PublicKey
	api     *http.Server
	metrics *http.Server // nil without metricsLn
	extra   func(ctx context.Context, log *slog.Logger) error

	closers []func() error
}

// New checks the configuration, binds the listeners, checks the cluster,
// opens the record and builds every part of serve. On error, whatever it
// opened is closed again.
func New(ctx context.Context, o Options) (_ *App, err error) {
	if o.Log == nil {
		return nil, errors.New("app: no Log")
	}
	if err := o.Config.Check(); err != nil {
		return nil, err
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	a := &App{cfg: o.Config, log: o.Log, extra: o.Extra, met: metrics.New()}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if err := a.bind(); err != nil {
		return nil, err
	}
	if err := a.connect(ctx); err != nil {
		return nil, err
	}
	if err := a.openRecord(ctx, o.Stdout); err != nil {
		return nil, err
	}
	if err := a.buildCore(ctx); err != nil {
		return nil, err
	}
	// Previews reach sandboxes through the gateway's helper leg, so it is
	// built for them even when it serves no SSH.
	if a.sshLn != nil || a.cfg.PreviewDomain != "" {
		if err := a.buildGateway(ctx); err != nil {
			return nil, err
		}
	}
	if err := a.buildHTTP(); err != nil {
		return nil, err
	}
	a.log.Info("serving", "addr", a.addrs.API, "namespace", a.cfg.Namespace, "db", a.cfg.DB, "cluster", a.clients.Config.Host)
	return a, nil
}

// Addrs are the addresses the listeners are bound to.
func (a *App) Addrs() Addrs { return a.addrs }

// HostKey is the SSH gateway's host key; nil without the gateway.
func (a *App) HostKey() gossh.PublicKey { return a.hostKey }

// ClusterHost is the address of the cluster's API server.
func (a *App) ClusterHost() string { return a.clients.Config.Host }

// bind binds every listener.
func (a *App) bind() (err error) {
	if a.ln, err = a.listen("--listen", a.cfg.Listen); err != nil {
		return err
	}
	a.addrs.API = a.ln.Addr().String()
	if a.cfg.MetricsListen != "" {
		if a.metricsLn, err = a.listen("--metrics-listen", a.cfg.MetricsListen); err != nil {
			return err
		}
		a.addrs.Metrics = a.metricsLn.Addr().String()
	}
	if a.cfg.SSHListen != "" {
		if a.sshLn, err = a.listen("--ssh-listen", a.cfg.SSHListen); err != nil {
			return err
		}
		a.addrs.SSH = a.sshLn.Addr().String()
	}
	return nil
}

// listen binds one listener, naming its flag when it fails.
func (a *App) listen(flag, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	a.closers = append(a.closers, func() error {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	})
	return ln, nil
}

// connect reaches the cluster and checks that it serves the Sandbox API.
func (a *App) connect(ctx context.Context) (err error) {
	if a.clients, err = a.cfg.Clients(ctx); err != nil {
		return err
	}
	checkCtx, cancel := context.WithTimeout(ctx, a.cfg.ClusterTimeout)
	defer cancel()
	return a.clients.CheckSandboxAPI(checkCtx)
}

// openRecord opens the record and, on first start, makes the admin
// organization and its first key (bootstrap).
func (a *App) openRecord(ctx context.Context, stdout io.Writer) (err error) {
	if a.db, err = store.Open(ctx, store.Options{Path: a.cfg.DB}); err != nil {
		return err
	}
	a.closers = append(a.closers, a.db.Close)
	if err := a.bootstrap(ctx, stdout); err != nil {
		return err
	}
	if a.cfg.NoGVisor {
		a.log.Warn("INSECURE: --insecure-no-gvisor: sandboxes run WITHOUT gVisor and share the node's kernel; for development clusters only")
		fmt.Fprintln(stdout, "WARNING: --insecure-no-gvisor: sandboxes run without gVisor and share the node's kernel. Development only.")
	}
	return nil
}

// buildCore builds the core over the cluster adapter, runs the first
// isolation self-check, and builds the mirror that feeds the core the
// cluster's state.
func (a *App) buildCore(ctx context.Context) error {
	cfg := &a.cfg
	writer, err := k8s.NewWriter(a.clients, k8s.RenderOptions{Namespace: cfg.Namespace, RuntimeClass: cfg.RuntimeClass, NoGVisor: cfg.NoGVisor,
		Transports: cfg.Transports, AgentImage: cfg.AgentImage, SessionPort: cfg.SessionPort,
		DefaultCPULimit: cfg.DefaultCPULimit, DefaultMemoryLimit: cfg.DefaultMemoryLimit})
	if err != nil {
		return err
	}
	a.core, err = control.New(control.Options{
		Store: a.db, Cluster: writer, Log: a.log, ClusterTimeout: cfg.ClusterTimeout, Metrics: a.met,
		Exec: &k8s.Execer{Clients: a.clients, Namespace: cfg.Namespace, ConnectTimeout: cfg.ClusterTimeout},
		Caps: control.Capabilities{StorageClasses: cfg.StorageClasses, Transports: cfg.Transports},
		Limits: control.Limits{PerSandbox: cfg.ExecPerSandbox, PerOrg: cfg.ExecPerOrg, APIKeysPerOrg: cfg.MaxAPIKeysPerOrg, SSHKeysPerOrg: cfg.MaxSSHKeysPerOrg,
			WakeWaitsPerKey: cfg.MaxWaitingWakesPerKey, WakeWaitsPerOrg: cfg.MaxWaitingWakesPerOrg, PreviewsPerSandbox: cfg.MaxPreviewsPerSandbox},
		Boundary: func(ctx context.Context) []cluster.Check {
			return boundary.Check(ctx, a.clients, cfg.BoundaryOptions())
		},
		BoundaryInterval:   cfg.SelfCheck,
		EventRetention:     cfg.EventRetention,
		DefaultIdleTimeout: cfg.DefaultIdleTimeout,
		WakeTimeout:        cfg.WakeTimeout,
		// Under --insecure-no-gvisor nothing is promised, so nothing is
		// attested, and runtime_observed stays absent.
		RuntimeAttestation: cfg.RuntimeAttestation && !cfg.NoGVisor,
	})
	if err != nil {
		return err
	}
	a.met.Watch(a.core)
	// The first self-check runs before traffic; until it passes, creates
	// and starts are refused (and /readyz says why).
	a.core.CheckBoundary(ctx)
	a.mirror, err = mirror.New(mirror.Options{Clients: a.clients, Store: a.db, Namespace: cfg.Namespace, Log: a.log, Control: a.core, Metrics: a.met,
		Written: writer.Written, Writing: a.core.ModeWriting})
	return err
}

// buildGateway builds the SSH gateway with the record's host key.
func (a *App) buildGateway(ctx context.Context) error {
	cfg := &a.cfg
	hostKey, err := a.db.HostKey(ctx)
	if err != nil {
		return err
	}
	a.gateway, err = sshd.New(sshd.Options{Control: a.core, HostKey: hostKey, Log: a.log, KeepAlive: cfg.SSHKeepAlive, IdleTimeout: cfg.SSHIdleTimeout, Metrics: a.met,
		LoginGrace: cfg.SSHLoginGrace, MaxStartups: cfg.SSHMaxStartups, MaxStartupsPerSource: cfg.SSHMaxStartupsPerSource,
		StartupQueue: cfg.SSHStartupQueue, StartupWait: cfg.SSHStartupWait, Penalties: cfg.SSHPenalties,
		MaxConnsPerKey: cfg.SSHMaxConnsPerKey, MaxConnsPerOrg: cfg.SSHMaxConnsPerOrg, MaxChannelsPerConn: cfg.SSHMaxChannelsPerConn,
		MaxChannelsPerOrg: cfg.SSHMaxChannelsPerOrg, HelperDialTimeout: cfg.SSHHelperDialTimeout})
	if err != nil {
		return err
	}
	if a.sshLn != nil {
		a.hostKey = hostKey.PublicKey()
	}
	return nil
}

// buildHTTP builds the API's server and the metrics endpoint's, each
// behind the HTTP listener limits.
func (a *App) buildHTTP() error {
	cfg := &a.cfg
	sshPort := 0
	if a.sshLn != nil {
		sshPort = a.sshLn.Addr().(*net.TCPAddr).Port
	}
	var previews server.Previews
	if cfg.PreviewDomain != "" {
		previews = server.Previews{Domain: cfg.PreviewDomain, Scheme: cfg.PreviewURLScheme(), Dial: a.gateway.DialPort}
	}
	api, err := server.New(server.Options{
		Control: a.core, Log: a.log, HostKey: a.hostKey, SSHPort: sshPort, Metrics: a.met,
		MaxFileBytes: cfg.MaxFileSize, Previews: previews,
		RateLimits: server.RateLimits{PerKey: rate.Limit(cfg.RateLimit), Burst: int(2 * cfg.RateLimit),
			Creates: rate.Limit(cfg.CreateRateLimit), CreateBurst: int(5 * cfg.CreateRateLimit),
			PerOrg: rate.Limit(cfg.OrgRateLimit), OrgBurst: max(1, int(2*cfg.OrgRateLimit)),
			OrgCreates: rate.Limit(cfg.OrgCreateRateLimit), OrgCreateBurst: max(1, int(5*cfg.OrgCreateRateLimit)),
			PerAddress: rate.Limit(cfg.AddressRateLimit), AddressBurst: max(1, int(2*cfg.AddressRateLimit))},
		// Ready means hiloop can serve: the record answers and the mirror
		// has synced. Neither the cluster nor the isolation self-check
		// counts: while the boundary fails, creates and starts are refused
		// (503 cluster_not_hardened), and reads, stops, deletes and
		// sessions must go on, so hiloop stays in its Services.
		Ready: func(ctx context.Context) error {
			if !a.mirror.Ready() {
				return errors.New("status mirror has not synced yet")
			}
			return a.db.Probe(ctx)
		},
	})
	if err != nil {
		return err
	}
	limits := &server.ConnLimits{IOTimeout: cfg.HTTPIOTimeout, MaxHeaderReads: cfg.HTTPMaxHeaderReads,
		MaxHeaderReadsPerSource: cfg.HTTPMaxHeaderReadsPerSource, Metrics: a.met}
	a.api, a.ln = limits.Server(api, a.ln)
	if a.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", a.met.Handler())
		a.metrics, a.metricsLn = limits.Server(mux, a.metricsLn)
	}
	return nil
}

// Run runs every part in one errgroup until ctx ends or one of them fails,
// then drains them under the shutdown timeout and closes what New opened.
// It returns once every part has stopped.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveHTTP(a.api, a.ln) })
	if a.sshLn != nil {
		g.Go(func() error { return a.gateway.Serve(a.sshLn) })
	}
	if a.metrics != nil {
		g.Go(func() error { return serveHTTP(a.metrics, a.metricsLn) })
	}
	g.Go(func() error { return a.mirror.Run(gctx) })
	g.Go(func() error { return a.core.Run(gctx) })
	if a.extra != nil {
		g.Go(func() error { return a.extra(gctx, a.log) })
	}
	g.Go(func() error {
		<-gctx.Done()
		return a.shutdown()
	})
	return g.Wait()
}

// shutdown drains every part under one timeout: live sessions (hijacked
// connections http.Server.Shutdown does not see) get a final frame saying
// why, then the servers drain.
func (a *App) shutdown() error {
	a.log.Info("shutting down", "sessions", a.core.Sessions())
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	errs := []error{a.core.Close(ctx)}
	if a.gateway != nil {
		errs = append(errs, a.gateway.Shutdown(ctx))
	}
	if a.metrics != nil {
		errs = append(errs, a.metrics.Shutdown(ctx))
	}
	errs = append(errs, a.api.Shutdown(ctx))
	return errors.Join(errs...)
}

// Close closes what New opened, the last first, for an App that will not
// Run (Run closes it itself). It is safe to call more than once.
func (a *App) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		if err := a.closers[i](); err != nil {
			a.log.Warn("close", "err", err)
		}
	}
	a.closers = nil
}

// serveHTTP serves srv on ln until it is shut down.
func serveHTTP(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
