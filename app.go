package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"
	"golang.org/x/term"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/mirror"
	"github.com/hiloop/hiloop/server"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
)

// app is one whole hiloop serve: its listeners bound and every part built,
// not yet running. newApp builds it, Run runs it; building is apart from
// running, so a failure to start leaves nothing running, and a test can run
// a whole hiloop in-process on :0.
type app struct {
	cfg *ServeCmd
	log *slog.Logger

	// Listeners, bound first so a port in use fails before anything starts.
	// metricsLn and sshLn are nil when turned off.
	ln, metricsLn, sshLn net.Listener

	db      *store.Store
	core    *control.Control
	mirror  *mirror.Mirror
	gateway *sshd.Gateway // nil without sshLn
	api     *http.Server
	metrics *http.Server // nil without metricsLn
	// extra runs beside the parts (the local helper runner of hiloop dev);
	// nil when there is none.
	extra func(ctx context.Context, log *slog.Logger) error

	closers []func() error
}

// newApp binds the listeners, checks the cluster, opens the record and
// builds every part of serve. extra, when set, runs with them in Run. On
// error, whatever it opened is closed again.
func newApp(ctx context.Context, cfg *ServeCmd, stdout io.Writer, extra func(context.Context, *slog.Logger) error) (_ *app, err error) {
	a := &app{cfg: cfg, log: cfg.logger(), extra: extra}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if a.ln, err = a.listen("--listen", cfg.Listen); err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "" {
		if a.metricsLn, err = a.listen("--metrics-listen", cfg.MetricsListen); err != nil {
			return nil, err
		}
	}
	if cfg.SSHListen != "" {
		if a.sshLn, err = a.listen("--ssh-listen", cfg.SSHListen); err != nil {
			return nil, err
		}
	}

	clients, err := cfg.clients(ctx)
	if err != nil {
		return nil, err
	}
	checkCtx, cancel := context.WithTimeout(ctx, cfg.ClusterTimeout)
	err = clients.CheckSandboxAPI(checkCtx)
	cancel()
	if err != nil {
		return nil, err
	}

	if a.db, err = store.Open(ctx, store.Options{Path: cfg.DB}); err != nil {
		return nil, err
	}
	a.closers = append(a.closers, a.db.Close)
	if err := a.bootstrap(ctx, stdout); err != nil {
		return nil, err
	}
	if cfg.NoGVisor {
		a.log.Warn("INSECURE: --insecure-no-gvisor: sandboxes run WITHOUT gVisor and share the node's kernel; for development clusters only")
		fmt.Fprintln(stdout, "WARNING: --insecure-no-gvisor: sandboxes run without gVisor and share the node's kernel. Development only.")
	}

	writer, err := k8s.NewWriter(clients, k8s.RenderOptions{Namespace: cfg.Namespace, RuntimeClass: cfg.RuntimeClass, NoGVisor: cfg.NoGVisor,
		Transports: cfg.Transports, AgentImage: cfg.AgentImage, SessionPort: cfg.SessionPort,
		DefaultCPULimit: cfg.DefaultCPULimit, DefaultMemoryLimit: cfg.DefaultMemoryLimit})
	if err != nil {
		return nil, err
	}
	met := metrics.New()
	a.core, err = control.New(control.Options{
		Store: a.db, Cluster: writer, Log: a.log, ClusterTimeout: cfg.ClusterTimeout, Metrics: met,
		Exec: &k8s.Execer{Clients: clients, Namespace: cfg.Namespace, ConnectTimeout: cfg.ClusterTimeout},
		Caps: control.Capabilities{StorageClasses: cfg.StorageClasses, Transports: cfg.Transports},
		Limits: control.Limits{PerSandbox: cfg.ExecPerSandbox, PerOrg: cfg.ExecPerOrg, APIKeysPerOrg: cfg.MaxAPIKeysPerOrg, SSHKeysPerOrg: cfg.MaxSSHKeysPerOrg,
			WakeWaitsPerKey: cfg.MaxWaitingWakesPerKey, WakeWaitsPerOrg: cfg.MaxWaitingWakesPerOrg},
		Boundary: func(ctx context.Context) []cluster.Check {
			return clients.CheckBoundary(ctx, cfg.boundaryOptions())
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
		return nil, err
	}
	met.Watch(a.core)
	// The first self-check runs before traffic; until it passes, creates
	// and starts are refused (and /readyz says why).
	a.core.CheckBoundary(ctx)
	if a.mirror, err = mirror.New(mirror.Options{Clients: clients, Store: a.db, Namespace: cfg.Namespace, Log: a.log, Control: a.core, Metrics: met,
		Written: writer.Written, Writing: a.core.ModeWriting}); err != nil {
		return nil, err
	}

	var hostPub gossh.PublicKey
	sshPort := 0
	if a.sshLn != nil {
		hostKey, err := a.db.HostKey(ctx)
		if err != nil {
			return nil, err
		}
		a.gateway, err = sshd.New(sshd.Options{Control: a.core, HostKey: hostKey, Log: a.log, KeepAlive: cfg.SSHKeepAlive, IdleTimeout: cfg.SSHIdleTimeout, Metrics: met,
			LoginGrace: cfg.SSHLoginGrace, MaxStartups: cfg.SSHMaxStartups, MaxStartupsPerSource: cfg.SSHMaxStartupsPerSource,
			StartupQueue: cfg.SSHStartupQueue, StartupWait: cfg.SSHStartupWait, Penalties: cfg.SSHPenalties,
			MaxConnsPerKey: cfg.SSHMaxConnsPerKey, MaxConnsPerOrg: cfg.SSHMaxConnsPerOrg, MaxChannelsPerConn: cfg.SSHMaxChannelsPerConn, MaxChannelsPerOrg: cfg.SSHMaxChannelsPerOrg, HelperDialTimeout: cfg.SSHHelperDialTimeout})
		if err != nil {
			return nil, err
		}
		hostPub, sshPort = hostKey.PublicKey(), a.sshLn.Addr().(*net.TCPAddr).Port
		fmt.Fprintf(stdout, "hiloop ssh gateway on %s (host key %s)\n", a.sshLn.Addr(), gossh.FingerprintSHA256(hostKey.PublicKey()))
	}
	api, err := server.New(server.Options{
		Control: a.core, Log: a.log, HostKey: hostPub, SSHPort: sshPort, Metrics: met,
		// An upload may take as long as it keeps moving: its body's
		// deadline moves ahead by the I/O timeout with each read.
		MaxFileBytes: cfg.MaxFileSize, FileIdleTimeout: cfg.HTTPIOTimeout,
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
		return nil, err
	}
	limits := &httpLimits{IOTimeout: cfg.HTTPIOTimeout, MaxHeaderReads: cfg.HTTPMaxHeaderReads,
		MaxHeaderReadsPerSource: cfg.HTTPMaxHeaderReadsPerSource, Metrics: met}
	a.api, a.ln = limits.server(api, a.ln)
	if a.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", met.Handler())
		a.metrics, a.metricsLn = limits.server(mux, a.metricsLn)
		fmt.Fprintf(stdout, "hiloop metrics on http://%s/metrics\n", a.metricsLn.Addr())
	}
	a.log.Info("serving", "addr", a.ln.Addr().String(), "namespace", cfg.Namespace, "db", cfg.DB, "cluster", clients.Config.Host)
	fmt.Fprintf(stdout, "hiloop %s serving on http://%s (cluster %s, namespace %s)\n", version, a.ln.Addr(), clients.Config.Host, cfg.Namespace)
	return a, nil
}

// bootstrap creates the admin organization and its first key on first
// start. The key goes to the bootstrap key file, mode 0600, and to stdout
// only when stdout is a terminal: in a cluster stdout is the pod's log,
// which many can read. The log says where the file is, never the key.
func (a *app) bootstrap(ctx context.Context, stdout io.Writer) error {
	path := a.cfg.bootstrapKeyFile()
	// The file is made (0600, empty) before the key exists, so a directory
	// hiloop cannot write to fails the start before a key is issued that
	// nobody could read. It replaces path only once it holds the key.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".hiloop-admin-key-*")
	if err != nil {
		return fmt.Errorf("--bootstrap-key-file: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	org, secret, err := a.db.Bootstrap(ctx, a.cfg.AdminOrg)
	if err != nil || secret == "" {
		return err
	}
	if err := writeKeyFile(tmp, path, secret); err != nil {
		return fmt.Errorf("--bootstrap-key-file: the first key of %s was issued but not written (%w); issue another with `hiloop key create --db %s --org %s`", org.Name, err, a.cfg.DB, org.Name)
	}
	a.log.Info("created the admin organization and its first API key", "org", org.Name, "org_id", org.ID, "key_file", path)
	if isTerminal(stdout) {
		fmt.Fprintf(stdout, "Created organization %s (%s) and its first API key, also in %s. It is shown only this once:\n\n    HILOOP_TOKEN=%s\n\n", org.Name, org.ID, path, secret)
	}
	return nil
}

// writeKeyFile writes secret to tmp and moves tmp to path.
func writeKeyFile(tmp *os.File, path, secret string) error {
	if _, err := tmp.WriteString(secret + "\n"); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// listen binds one listener, naming its flag when it fails.
func (a *app) listen(flag, addr string) (net.Listener, error) {
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

// Run runs every part in one errgroup until ctx ends or one of them fails,
// then drains them under the shutdown timeout and closes what newApp
// opened.
func (a *app) Run(ctx context.Context) error {
	defer a.close()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveHTTP(a.api, a.ln) })
	if a.gateway != nil {
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
func (a *app) shutdown() error {
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

// close closes what newApp opened, the last first.
func (a *app) close() {
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

// logger is the configured logger; client-go's own logging goes through it
// too, at one level less chatty.
func (s *ServeCmd) logger() *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(s.LogLevel))
	handler := func(l slog.Level) slog.Handler {
		if s.LogFormat == "json" {
			return slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})
		}
		return slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})
	}
	klog.SetSlogLogger(slog.New(handler(max(level, slog.LevelWarn))).With("component", "client-go"))
	return slog.New(handler(level))
}
