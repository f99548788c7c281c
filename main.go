// Command hiloop is a self-hosted control plane for untrusted sandboxes on
// Kubernetes: one sandbox is one gVisor pod described by an agent-sandbox
// Sandbox. One binary serves the API, mirrors observed state into an embedded
// SQLite record, and is also the CLI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"golang.org/x/sync/errgroup"
	"golang.org/x/term"
	"k8s.io/klog/v2"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/k8s/k8stest"
	"github.com/hiloop/hiloop/mirror"
	"github.com/hiloop/hiloop/server"
	"github.com/hiloop/hiloop/store"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// CLI is the whole command-line grammar.
type CLI struct {
	Serve   ServeCmd   `cmd:"" help:"Run the control plane: HTTP API, status mirror and product record."`
	Dev     DevCmd     `cmd:"" help:"Start a local simulated cluster (no Docker needed) and serve against it."`
	Sandbox SandboxCmd `cmd:"" help:"Create, inspect and control sandboxes through the API."`
	Org     OrgCmd     `cmd:"" help:"Manage organizations in the database file (offline admin)."`
	Key     KeyCmd     `cmd:"" help:"Manage API keys: offline with --db, or your own org's through the API."`
	Version VersionCmd `cmd:"" help:"Print the version."`
}

// VersionCmd prints the version.
type VersionCmd struct{}

// Run prints the version.
func (VersionCmd) Run(stdout io.Writer) error {
	fmt.Fprintf(stdout, "hiloop %s\n", version)
	return nil
}

// ServeCmd runs the control plane.
type ServeCmd struct {
	Listen          string        `default:"127.0.0.1:8080" env:"HILOOP_LISTEN" help:"Address of the HTTP API."`
	DB              string        `default:"hiloop.db" env:"HILOOP_DB" help:"Path of the SQLite product record."`
	Kubeconfig      string        `env:"HILOOP_KUBECONFIG" help:"Kubeconfig file (default: in-cluster, then KUBECONFIG and ~/.kube/config)."`
	Namespace       string        `default:"hiloop-sandboxes" env:"HILOOP_NAMESPACE" help:"Namespace that holds the sandboxes."`
	RuntimeClass    string        `default:"gvisor" env:"HILOOP_RUNTIME_CLASS" help:"RuntimeClass every sandbox pod runs under."`
	StorageClasses  []string      `env:"HILOOP_STORAGE_CLASSES" help:"Storage classes volumes may name (the cluster default is always allowed)."`
	Transports      []string      `default:"exec" env:"HILOOP_TRANSPORTS" help:"Transports this deployment backs."`
	ExecPerSandbox  int           `default:"8" env:"HILOOP_EXEC_PER_SANDBOX" help:"Most concurrent exec sessions per sandbox."`
	ExecPerOrg      int           `default:"32" env:"HILOOP_EXEC_PER_ORG" help:"Most concurrent exec sessions per organization."`
	AdminOrg        string        `default:"admin" env:"HILOOP_ADMIN_ORG" help:"Name of the organization created on first start."`
	ClusterTimeout  time.Duration `default:"10s" env:"HILOOP_CLUSTER_TIMEOUT" help:"How long to wait for the cluster at start-up and per write."`
	ShutdownTimeout time.Duration `default:"15s" env:"HILOOP_SHUTDOWN_TIMEOUT" help:"How long to drain on SIGINT/SIGTERM."`
	LogLevel        string        `default:"info" enum:"debug,info,warn,error" env:"HILOOP_LOG_LEVEL" help:"Log level: debug, info, warn, error."`
}

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// knownTransports are the transports hiloop can back at all.
var knownTransports = []string{"exec"}

// Validate checks the flags; kong reports a failure naming the flag, exit 2.
func (s *ServeCmd) Validate() error {
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		return fmt.Errorf("--listen: %q is not host:port", s.Listen)
	}
	if s.DB == "" {
		return errors.New("--db: must not be empty")
	}
	if s.Kubeconfig != "" {
		if _, err := os.Stat(s.Kubeconfig); err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
	}
	if !dnsLabelRE.MatchString(s.Namespace) {
		return fmt.Errorf("--namespace: %q is not a valid namespace name", s.Namespace)
	}
	if !dnsLabelRE.MatchString(s.RuntimeClass) {
		return fmt.Errorf("--runtime-class: %q is not a valid RuntimeClass name", s.RuntimeClass)
	}
	for _, t := range s.Transports {
		if !slices.Contains(knownTransports, t) {
			return fmt.Errorf("--transports: unknown transport %q (known: %s)", t, strings.Join(knownTransports, ", "))
		}
	}
	if s.ExecPerSandbox < 1 {
		return errors.New("--exec-per-sandbox: must be at least 1")
	}
	if s.ExecPerOrg < 1 {
		return errors.New("--exec-per-org: must be at least 1")
	}
	if s.ClusterTimeout <= 0 {
		return errors.New("--cluster-timeout: must be positive")
	}
	if s.ShutdownTimeout <= 0 {
		return errors.New("--shutdown-timeout: must be positive")
	}
	return nil
}

// Run serves until SIGINT or SIGTERM.
func (s *ServeCmd) Run(stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return s.run(ctx, stdout)
}

func (s *ServeCmd) run(ctx context.Context, stdout io.Writer) error {
	var level slog.Level
	level.UnmarshalText([]byte(s.LogLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// client-go's own logging goes through slog, at one level less chatty.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: max(level, slog.LevelWarn)})).With("component", "client-go"))

	// The listener is bound first: a port in use fails before anything starts.
	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer ln.Close()
	cfg, err := k8s.LoadConfig(s.Kubeconfig)
	if err != nil {
		return err
	}
	clients, err := k8s.NewClients(cfg)
	if err != nil {
		return err
	}
	if err := clients.CheckReachable(ctx, s.ClusterTimeout); err != nil {
		return err
	}
	if err := clients.CheckSandboxAPI(ctx); err != nil {
		return err
	}

	db, err := store.Open(ctx, store.Options{Path: s.DB})
	if err != nil {
		return err
	}
	defer db.Close()
	org, secret, err := db.Bootstrap(ctx, s.AdminOrg)
	if err != nil {
		return err
	}
	if secret != "" {
		fmt.Fprintf(stdout, "Created organization %s (%s) and its first API key. It is shown only this once:\n\n    HILOOP_TOKEN=%s\n\n", org.Name, org.ID, secret)
	}

	writer, err := k8s.NewWriter(clients, k8s.RenderOptions{Namespace: s.Namespace, RuntimeClass: s.RuntimeClass, Transports: s.Transports})
	if err != nil {
		return err
	}
	var api *server.Server
	mir, err := mirror.New(mirror.Options{Clients: clients, Store: db, Namespace: s.Namespace, Log: log,
		Recover: func(ctx context.Context, sb store.Sandbox) { api.FinishPending(ctx, sb) }})
	if err != nil {
		return err
	}
	api, err = server.New(server.Options{
		Store: db, Cluster: writer, Log: log, ClusterTimeout: s.ClusterTimeout,
		Caps:       server.Capabilities{StorageClasses: s.StorageClasses, Transports: s.Transports},
		Observe:    mir.Enqueue,
		Exec:       &k8s.Execer{Clients: clients, Namespace: s.Namespace},
		ExecLimits: server.ExecLimits{PerSandbox: s.ExecPerSandbox, PerOrg: s.ExecPerOrg},
		Ready: func(ctx context.Context) error {
			if !mir.Ready() {
				return errors.New("status mirror has not synced yet")
			}
			return clients.CheckSandboxAPI(ctx)
		},
	})
	if err != nil {
		return err
	}
	httpSrv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", "addr", ln.Addr().String(), "namespace", s.Namespace, "db", s.DB, "cluster", cfg.Host)
	fmt.Fprintf(stdout, "hiloop %s serving on http://%s (cluster %s, namespace %s)\n", version, ln.Addr(), cfg.Host, s.Namespace)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error { return mir.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
		defer cancel()
		return httpSrv.Shutdown(sctx)
	})
	return g.Wait()
}

// DevCmd runs hiloop against a local simulated cluster.
type DevCmd struct {
	ClusterBin string `required:"" env:"HILOOP_CLUSTER_BIN" help:"Directory of the cluster binaries (printed by testdata/cluster/build.sh)."`
	ServeCmd   `embed:""`
}

// Run starts the cluster, serves against it, and tears it down on exit.
func (d *DevCmd) Run(stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(stdout, "Starting the local cluster (etcd, kube-apiserver, scheduler, controller-manager, kwok, agent-sandbox controller)...")
	c, err := k8stest.Start(ctx, k8stest.Options{BinDir: d.ClusterBin, Namespace: d.Namespace, Log: os.Stderr})
	if c != nil {
		defer c.Stop()
	}
	if err != nil {
		return err
	}
	d.Kubeconfig = c.Kubeconfig
	if len(d.StorageClasses) == 0 {
		d.StorageClasses = []string{"kwok-volume"}
	}
	fmt.Fprintf(stdout, "Local cluster up. Inspect it with:\n\n    kubectl --kubeconfig %s get sandboxes,pods -n %s\n\n", c.Kubeconfig, c.Namespace)
	return d.ServeCmd.run(ctx, stdout)
}

// Conn says where the API is and who calls it.
type Conn struct {
	URL   string `default:"http://127.0.0.1:8080" env:"HILOOP_URL" help:"URL of the hiloop API."`
	Token string `env:"HILOOP_TOKEN" help:"API key."`
}

func (c *Conn) api() *server.Client { return &server.Client{URL: c.URL, Token: c.Token} }

// Client flags shared by the commands that talk to the API and print.
type Client struct {
	Conn   `embed:""`
	Output string `short:"o" default:"table" enum:"table,json" help:"Output format: table or json."`
}

func (c *Client) print(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	if c.Output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

func sandboxRows(tw *tabwriter.Writer, list ...server.Sandbox) {
	fmt.Fprintln(tw, "ID\tSTATE\tDESIRED\tIMAGE\tEXPIRES\tREASON")
	for _, sb := range list {
		state := string(sb.State)
		if sb.Anomaly != "" {
			state += "/" + sb.Anomaly
		}
		reason := sb.Reason
		if sb.ExitCode != nil {
			reason = strings.TrimSpace(fmt.Sprintf("exit %d %s", *sb.ExitCode, reason))
		}
		expires := "-"
		if sb.ExpiresAt != nil {
			expires = sb.ExpiresAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, state, sb.Desired, sb.Image, expires, reason)
	}
}

// SandboxCmd groups the sandbox commands.
type SandboxCmd struct {
	Create SandboxCreateCmd `cmd:"" help:"Create a sandbox."`
	List   SandboxListCmd   `cmd:"" help:"List sandboxes."`
	Get    SandboxGetCmd    `cmd:"" help:"Show one sandbox."`
	Stop   SandboxActionCmd `cmd:"" help:"Stop a sandbox (volumes survive, processes do not)."`
	Start  SandboxActionCmd `cmd:"" help:"Start a stopped sandbox."`
	Ttl    SandboxTTLCmd    `cmd:"" name:"ttl" help:"Set a sandbox's TTL from now."`
	Delete SandboxActionCmd `cmd:"" help:"Delete a sandbox."`
	Wait   SandboxWaitCmd   `cmd:"" help:"Wait until a sandbox reaches a state."`
	Events SandboxGetCmd    `cmd:"" help:"Show a sandbox's state history."`
	Exec   SandboxExecCmd   `cmd:"" help:"Run a command in a sandbox and exit with its exit code."`
}

// SandboxExecCmd runs a command in a sandbox, streaming its I/O.
type SandboxExecCmd struct {
	Conn        `embed:""`
	ID          string        `arg:"" help:"Sandbox id."`
	Interactive bool          `short:"i" help:"Pass stdin to the command."`
	TTY         bool          `short:"t" help:"Allocate a terminal (implies -i); the local one goes raw and its size follows."`
	Timeout     time.Duration `help:"Kill the command after this long (default: no limit but the server's)."`
	Command     []string      `arg:"" passthrough:"" help:"Command and arguments, after --."`
}

// exitCode makes hiloop exit with a remote command's own code.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// execFailure is hiloop's own failure during exec: exit 255, like ssh.
type execFailure struct{ error }

// ExitCode makes kong exit 255.
func (execFailure) ExitCode() int { return 255 }

// Run runs the command and returns its exit code as an exitCode.
func (c *SandboxExecCmd) Run() error {
	if len(c.Command) > 0 && c.Command[0] == "--" {
		c.Command = c.Command[1:]
	}
	if len(c.Command) == 0 {
		return usageError{errors.New("no command: hiloop sandbox exec ID -- CMD ARGS...")}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := server.StreamOptions{Command: c.Command, Stdout: os.Stdout, Stderr: os.Stderr, TTY: c.TTY, Timeout: c.Timeout}
	// A terminal without input is of no use; -t implies -i, as in ssh.
	if c.Interactive || c.TTY {
		o.Stdin = os.Stdin
	}
	if c.TTY {
		in := int(os.Stdin.Fd())
		if term.IsTerminal(in) {
			old, err := term.MakeRaw(in)
			if err != nil {
				return execFailure{fmt.Errorf("raw terminal: %w", err)}
			}
			defer term.Restore(in, old)
		}
		resize := make(chan server.ResizeFrame, 1)
		o.Resize = resize
		sendSize := func() {
			if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil && w > 0 && h > 0 {
				select {
				case resize <- server.ResizeFrame{Width: uint16(w), Height: uint16(h)}:
				default:
				}
			}
		}
		sendSize()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				sendSize()
			}
		}()
	}
	f, err := c.api().ExecStream(ctx, c.ID, o)
	switch {
	case err == nil:
		return exitCode(*f.ExitCode)
	case ctx.Err() != nil:
		// Ctrl-C (without -t) cancels the remote command.
		return exitCode(130)
	default:
		return execFailure{err}
	}
}

// SandboxCreateCmd creates a sandbox.
type SandboxCreateCmd struct {
	Client         `embed:""`
	Image          string            `arg:"" help:"Image to run, entrypoint unmodified."`
	CPU            string            `help:"CPU request (and limit unless --cpu-limit)."`
	CPULimit       string            `name:"cpu-limit" help:"CPU limit."`
	Memory         string            `help:"Memory request (and limit unless --memory-limit)."`
	MemoryLimit    string            `help:"Memory limit."`
	TTL            string            `name:"ttl" help:"Time to live, such as 2h."`
	ShutdownPolicy string            `help:"What expiry does: retain or delete."`
	Volume         []string          `help:"Volume NAME:SIZE:MOUNTPATH[:STORAGECLASS]; repeatable."`
	Label          map[string]string `help:"Label KEY=VALUE; repeatable."`
	Transport      []string          `help:"Transport the sandbox needs; repeatable."`
	IdempotencyKey string            `help:"Idempotency-Key: a retry with the same key never makes a second sandbox."`
	Wait           bool              `help:"Wait until the sandbox runs, showing its progress."`
	Timeout        time.Duration     `default:"5m" help:"How long --wait waits."`
}

// Run creates the sandbox.
func (c *SandboxCreateCmd) Run(stdout io.Writer) error {
	req := server.CreateSandboxRequest{Image: c.Image, TTL: c.TTL, ShutdownPolicy: c.ShutdownPolicy, Labels: c.Label, Transports: c.Transport}
	if c.CPU != "" || c.CPULimit != "" || c.Memory != "" || c.MemoryLimit != "" {
		req.Resources = &server.Resources{CPURequest: c.CPU, CPULimit: c.CPULimit, MemoryRequest: c.Memory, MemoryLimit: c.MemoryLimit}
	}
	for _, v := range c.Volume {
		parts := strings.Split(v, ":")
		if len(parts) < 3 || len(parts) > 4 {
			return fmt.Errorf("--volume %q: want NAME:SIZE:MOUNTPATH[:STORAGECLASS]", v)
		}
		vr := server.VolumeRequest{Name: parts[0], Size: parts[1], MountPath: parts[2]}
		if len(parts) == 4 {
			vr.StorageClass = parts[3]
		}
		req.Volumes = append(req.Volumes, vr)
	}
	ctx := context.Background()
	sb, err := c.api().CreateSandbox(ctx, req, c.IdempotencyKey)
	if err != nil {
		return err
	}
	if c.Wait {
		sb, err = waitFor(ctx, c.api(), sb.ID, store.StateRunning, c.Timeout)
		if err != nil {
			return err
		}
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// waitFor waits for a state, showing progress on stderr: one line rewritten
// in place on a terminal, one line per state otherwise.
func waitFor(ctx context.Context, api *server.Client, id string, want store.State, timeout time.Duration) (server.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tty := term.IsTerminal(int(os.Stderr.Fd()))
	var trail []string
	start := time.Now()
	sb, err := api.Wait(ctx, id, want, func(sb server.Sandbox) {
		trail = append(trail, string(sb.State))
		line := fmt.Sprintf("%s: %s (%s)", id, strings.Join(trail, " -> "), time.Since(start).Round(100*time.Millisecond))
		if tty {
			fmt.Fprintf(os.Stderr, "\r\033[K%s", line)
		} else {
			fmt.Fprintln(os.Stderr, line)
		}
	})
	if tty {
		fmt.Fprintln(os.Stderr)
	}
	return sb, err
}

// SandboxListCmd lists sandboxes.
type SandboxListCmd struct {
	Client `embed:""`
	State  string   `help:"Only sandboxes in this state."`
	Label  []string `help:"Only sandboxes with label KEY=VALUE; repeatable."`
	Limit  int      `default:"100" help:"Page size."`
	After  string   `help:"Cursor: the previous page's next."`
	All    bool     `help:"Follow every page."`
}

// Run lists.
func (c *SandboxListCmd) Run(stdout io.Writer) error {
	ctx := context.Background()
	var all []server.Sandbox
	after := c.After
	next := ""
	for {
		page, err := c.api().ListSandboxes(ctx, c.State, c.Label, c.Limit, after)
		if err != nil {
			return err
		}
		all = append(all, page.Items...)
		next = page.Next
		if !c.All || page.Next == "" {
			break
		}
		after = page.Next
	}
	return c.print(stdout, server.SandboxList{Items: all, Next: next}, func(tw *tabwriter.Writer) {
		sandboxRows(tw, all...)
		if next != "" {
			tw.Flush()
			fmt.Fprintf(os.Stderr, "more: --after %s (or --all)\n", next)
		}
	})
}

// SandboxGetCmd shows one sandbox (get) or its history (events).
type SandboxGetCmd struct {
	Client `embed:""`
	ID     string `arg:"" help:"Sandbox id."`
}

// Run shows the sandbox or its events, depending on the command.
func (c *SandboxGetCmd) Run(kctx *kong.Context, stdout io.Writer) error {
	ctx := context.Background()
	if strings.HasSuffix(kctx.Command(), "events <id>") {
		evs, err := c.api().Events(ctx, c.ID)
		if err != nil {
			return err
		}
		return c.print(stdout, evs, func(tw *tabwriter.Writer) {
			fmt.Fprintln(tw, "AT\tFROM\tTO\tREASON")
			for _, e := range evs {
				from := string(e.From)
				if from == "" {
					from = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.At.Local().Format("2006-01-02 15:04:05.000"), from, e.To, e.Reason)
			}
		})
	}
	sb, err := c.api().Sandbox(ctx, c.ID)
	if err != nil {
		return err
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// SandboxActionCmd stops, starts or deletes a sandbox.
type SandboxActionCmd struct {
	Client `embed:""`
	ID     string `arg:"" help:"Sandbox id."`
}

// Run performs the action named by the command.
func (c *SandboxActionCmd) Run(kctx *kong.Context, stdout io.Writer) error {
	ctx := context.Background()
	action := strings.Fields(kctx.Command())[1]
	var sb server.Sandbox
	var err error
	if action == "delete" {
		sb, err = c.api().DeleteSandbox(ctx, c.ID)
	} else {
		sb, err = c.api().Action(ctx, c.ID, action)
	}
	if err != nil {
		return err
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// SandboxTTLCmd sets a TTL.
type SandboxTTLCmd struct {
	Client `embed:""`
	ID     string `arg:"" help:"Sandbox id."`
	TTL    string `arg:"" name:"ttl" help:"New time to live from now, such as 4h."`
}

// Run sets the TTL.
func (c *SandboxTTLCmd) Run(stdout io.Writer) error {
	sb, err := c.api().UpdateTTL(context.Background(), c.ID, c.TTL)
	if err != nil {
		return err
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// SandboxWaitCmd waits for a state.
type SandboxWaitCmd struct {
	Client  `embed:""`
	ID      string        `arg:"" help:"Sandbox id."`
	For     string        `default:"running" help:"State to wait for."`
	Timeout time.Duration `default:"5m" help:"How long to wait."`
}

// Run waits.
func (c *SandboxWaitCmd) Run(stdout io.Writer) error {
	if !slices.Contains(store.States, store.State(c.For)) {
		return usageError{fmt.Errorf("--for: %q is not a state", c.For)}
	}
	sb, err := waitFor(context.Background(), c.api(), c.ID, store.State(c.For), c.Timeout)
	if err != nil {
		return err
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// Offline admin flags.
type offline struct {
	DB string `default:"hiloop.db" env:"HILOOP_DB" help:"Path of the SQLite product record."`
}

// withDB opens the database file for fn and closes it after.
func (o offline) withDB(fn func(ctx context.Context, db *store.Store) error) error {
	ctx := context.Background()
	db, err := store.Open(ctx, store.Options{Path: o.DB})
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(ctx, db)
}

// withOrg is withDB with an organization looked up by id or name.
func (o offline) withOrg(idOrName string, fn func(ctx context.Context, db *store.Store, org store.Org) error) error {
	return o.withDB(func(ctx context.Context, db *store.Store) error {
		org, err := db.Org(ctx, idOrName)
		if err != nil {
			return err
		}
		return fn(ctx, db, org)
	})
}

// OrgCmd groups the organization commands.
type OrgCmd struct {
	Create OrgCreateCmd `cmd:"" help:"Create an organization and its first API key."`
	List   OrgListCmd   `cmd:"" help:"List organizations."`
	Quota  OrgQuotaCmd  `cmd:"" help:"Set an organization's quotas."`
}

// OrgCreateCmd creates an organization with a first key.
type OrgCreateCmd struct {
	offline
	Name         string `arg:"" help:"Organization name."`
	MaxSandboxes int    `default:"50" help:"Most sandboxes it may hold."`
	MaxRunning   int    `default:"20" help:"Most sandboxes it may run at once."`
}

// Run creates the organization.
func (c *OrgCreateCmd) Run(stdout io.Writer) error {
	if c.MaxSandboxes < 1 || c.MaxRunning < 1 {
		return usageError{errors.New("--max-sandboxes and --max-running: must be at least 1")}
	}
	return c.withDB(func(ctx context.Context, db *store.Store) error {
		org, err := db.CreateOrg(ctx, c.Name, c.MaxSandboxes, c.MaxRunning)
		if err != nil {
			return err
		}
		_, secret, err := db.CreateKey(ctx, org.ID, "first")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Created organization %s (%s). Its first API key, shown only this once:\n\n    HILOOP_TOKEN=%s\n", org.Name, org.ID, secret)
		return nil
	})
}

// OrgListCmd lists organizations.
type OrgListCmd struct{ offline }

// Run lists.
func (c *OrgListCmd) Run(stdout io.Writer) error {
	var orgs []store.Org
	err := c.withDB(func(ctx context.Context, db *store.Store) (err error) {
		orgs, err = db.Orgs(ctx)
		return err
	})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tMAX SANDBOXES\tMAX RUNNING")
	for _, o := range orgs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", o.ID, o.Name, o.MaxSandboxes, o.MaxRunning)
	}
	return tw.Flush()
}

// OrgQuotaCmd sets quotas.
type OrgQuotaCmd struct {
	offline
	Org          string `arg:"" help:"Organization id or name."`
	MaxSandboxes int    `required:"" help:"Most sandboxes it may hold."`
	MaxRunning   int    `required:"" help:"Most sandboxes it may run at once."`
}

// Run sets the quotas.
func (c *OrgQuotaCmd) Run(stdout io.Writer) error {
	if c.MaxSandboxes < 0 || c.MaxRunning < 0 {
		return usageError{errors.New("--max-sandboxes and --max-running: must not be negative")}
	}
	return c.withOrg(c.Org, func(ctx context.Context, db *store.Store, org store.Org) error {
		if err := db.SetQuota(ctx, org.ID, c.MaxSandboxes, c.MaxRunning); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: max %d sandboxes, %d running\n", org.Name, c.MaxSandboxes, c.MaxRunning)
		return nil
	})
}

// KeyCmd groups the key commands.
type KeyCmd struct {
	Create KeyCreateCmd `cmd:"" help:"Issue an API key."`
	List   KeyListCmd   `cmd:"" help:"List API keys."`
	Revoke KeyRevokeCmd `cmd:"" help:"Revoke an API key."`
}

// keyTarget says where a key command acts: the database file for --org
// (offline admin), else the API for the caller's own organization.
type keyTarget struct {
	Client `embed:""`
	offline
	Org string `help:"Organization id or name: act on the database file offline instead of through the API."`
}

// KeyCreateCmd issues a key.
type KeyCreateCmd struct {
	keyTarget
	Name string `default:"" help:"A name to remember the key by."`
}

// Run issues the key.
func (c *KeyCreateCmd) Run(stdout io.Writer) error {
	ctx := context.Background()
	var k server.CreatedKey
	var err error
	if c.Org != "" {
		err = c.withOrg(c.Org, func(ctx context.Context, db *store.Store, org store.Org) (err error) {
			k.APIKey, k.Secret, err = db.CreateKey(ctx, org.ID, c.Name)
			return err
		})
	} else {
		k, err = c.api().CreateKey(ctx, c.Name)
	}
	if err != nil {
		return err
	}
	return c.print(stdout, k, func(tw *tabwriter.Writer) {
		fmt.Fprintf(tw, "Key %s for %s, shown only this once:\n\n    HILOOP_TOKEN=%s\n", k.ID, k.OrgID, k.Secret)
	})
}

// KeyListCmd lists keys.
type KeyListCmd struct{ keyTarget }

// Run lists the keys.
func (c *KeyListCmd) Run(stdout io.Writer) error {
	ctx := context.Background()
	var keys []store.APIKey
	var err error
	if c.Org != "" {
		err = c.withOrg(c.Org, func(ctx context.Context, db *store.Store, org store.Org) (err error) {
			keys, err = db.Keys(ctx, org.ID)
			return err
		})
	} else {
		keys, err = c.api().Keys(ctx)
	}
	if err != nil {
		return err
	}
	return c.print(stdout, keys, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "ID\tNAME\tCREATED\tREVOKED")
		for _, k := range keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.Local().Format(time.DateTime)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Local().Format(time.DateTime), revoked)
		}
	})
}

// KeyRevokeCmd revokes a key.
type KeyRevokeCmd struct {
	keyTarget
	ID string `arg:"" help:"Key id."`
}

// Run revokes.
func (c *KeyRevokeCmd) Run(stdout io.Writer) error {
	var err error
	if c.Org != "" {
		err = c.withOrg(c.Org, func(ctx context.Context, db *store.Store, org store.Org) error {
			return db.RevokeKey(ctx, org.ID, c.ID)
		})
	} else {
		err = c.api().RevokeKey(context.Background(), c.ID)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s\n", c.ID)
	return nil
}

// usageError is a bad flag or argument found after parsing: exit 2.
type usageError struct{ error }

// ExitCode makes kong exit 2, as for a parse error.
func (usageError) ExitCode() int { return 2 }

func main() {
	var cli CLI
	parser, err := kong.New(&cli,
		kong.Name("hiloop"),
		kong.Description("hiloop runs untrusted sandboxes on Kubernetes, one gVisor pod each, and reaches into them.\n\n"+
			"Run the control plane with `hiloop serve` (or `hiloop dev` for a local simulated cluster);\n"+
			"drive it with `hiloop sandbox ...`, configured by HILOOP_URL and HILOOP_TOKEN."),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.BindTo(io.Writer(os.Stdout), (*io.Writer)(nil)),
	)
	if err != nil {
		panic(err)
	}
	ctx, err := parser.Parse(os.Args[1:])
	if err != nil {
		// Bad flags and config exit 2 (kong's own default is 80).
		parser.FatalIfErrorf(usageError{err})
	}
	err = ctx.Run()
	var code exitCode
	if errors.As(err, &code) {
		os.Exit(int(code))
	}
	ctx.FatalIfErrorf(err)
}
