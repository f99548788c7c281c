package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// SSHKeyCmd groups the SSH key commands.
type SSHKeyCmd struct {
	Add    SSHKeyAddCmd    `cmd:"" help:"Register an SSH public key for your organization."`
	List   SSHKeyListCmd   `cmd:"" help:"List your organization's SSH keys."`
	Delete SSHKeyDeleteCmd `cmd:"" help:"Remove an SSH key; its live sessions end."`
}

// SSHKeyAddCmd registers a public key file.
type SSHKeyAddCmd struct {
	Client `embed:""`
	File   string `arg:"" type:"existingfile" help:"Public key file, such as ~/.ssh/id_ed25519.pub."`
	Name   string `default:"" help:"A name to remember the key by (default: the key's comment)."`
}

// Run registers the key.
func (c *SSHKeyAddCmd) Run(ctx context.Context, stdout io.Writer) error {
	raw, err := os.ReadFile(c.File)
	if err != nil {
		return err
	}
	k, err := c.api().AddSSHKey(ctx, api.AddSSHKeyRequest{PublicKey: string(raw), Name: c.Name})
	if err != nil {
		return err
	}
	return c.print(stdout, k, func(tw *tabwriter.Writer) { sshKeyRows(tw, k) })
}

func sshKeyRows(tw *tabwriter.Writer, keys ...api.SSHKey) {
	fmt.Fprintln(tw, "ID\tNAME\tFINGERPRINT\tCREATED")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Fingerprint, k.CreatedAt.Local().Format(time.DateTime))
	}
}

// SSHKeyListCmd lists keys.
type SSHKeyListCmd struct {
	Client `embed:""`
}

// Run lists.
func (c *SSHKeyListCmd) Run(ctx context.Context, stdout io.Writer) error {
	keys, err := c.api().SSHKeys(ctx)
	if err != nil {
		return err
	}
	return c.print(stdout, keys, func(tw *tabwriter.Writer) { sshKeyRows(tw, keys...) })
}

// SSHKeyDeleteCmd removes a key.
type SSHKeyDeleteCmd struct {
	Conn `embed:""`
	ID   string `arg:"" help:"SSH key id."`
}

// Run removes it.
func (c *SSHKeyDeleteCmd) Run(ctx context.Context, stdout io.Writer) error {
	if err := c.api().DeleteSSHKey(ctx, c.ID); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "deleted %s\n", c.ID)
	return nil
}

// gatewayFlags say where the SSH gateway is: the API's host unless told
// otherwise, and the port the API reports.
type gatewayFlags struct {
	SSHHost string `name:"ssh-host" default:"" env:"HILOOP_SSH_HOST" help:"Host of the SSH gateway (default: the API's host)."`
}

// gateway is the gateway's host, port, host key, and the alias under which
// its key is pinned (one per host and port).
type gateway struct {
	host, port, alias, knownHosts string
}

func (g gatewayFlags) resolve(ctx context.Context, c *Conn) (gateway, error) {
	hk, err := c.api().HostKey(ctx)
	if err != nil {
		return gateway{}, err
	}
	if hk.Port == 0 || hk.PublicKey == "" {
		return gateway{}, errors.New("this hiloop runs no SSH gateway (serve --ssh-listen is empty)")
	}
	host := g.SSHHost
	if host == "" {
		u, err := url.Parse(c.URL)
		if err != nil || u.Hostname() == "" {
			return gateway{}, fmt.Errorf("HILOOP_URL %q has no host; pass --ssh-host", c.URL)
		}
		host = u.Hostname()
	}
	if host == "" || strings.ContainsFunc(host, notInHost) {
		return gateway{}, fmt.Errorf("SSH host %q is not a host name or address", host)
	}
	port := strconv.Itoa(hk.Port)
	alias := "hiloop-" + strings.NewReplacer(":", "-", "[", "", "]", "").Replace(net.JoinHostPort(host, port))
	key, err := hostKeyLine(hk.PublicKey)
	if err != nil {
		return gateway{}, err
	}
	return gateway{host: host, port: port, alias: alias, knownHosts: alias + " " + key}, nil
}

// notInHost reports whether r cannot be part of a host name or address in
// a known_hosts line: space or a control character would end the field or
// the line, and the others are its pattern and marker characters.
func notInHost(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune(`,*?!@#|"'\`, r)
}

// hostKeyLine is the key part of the known_hosts line for the gateway's
// host key as the API gave it: the key parsed and written out again, never
// the API's text, so an answer cannot add a line (a "@cert-authority *" that
// would trust any host) or options. Anything but exactly one plain public
// key is refused.
func hostKeyLine(text string) (string, error) {
	pub, _, options, rest, err := gossh.ParseAuthorizedKey([]byte(text))
	if err != nil || len(options) > 0 || len(bytes.TrimSpace(rest)) > 0 {
		return "", errors.New("the API's SSH host key is not a single public key; refusing to pin it")
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pub))), nil
}

// SSHConfigCmd prints what ~/.ssh/config and known_hosts need.
type SSHConfigCmd struct {
	Conn         `embed:""`
	gatewayFlags `embed:""`
	ID           string `arg:"" optional:"" help:"Sandbox id: a Host block for it (default: one for any sandbox, as ID@hiloop)."`
}

// Run prints a Host block and the known_hosts line; host-key checking stays
// on, against the pinned key.
func (c *SSHConfigCmd) Run(ctx context.Context, stdout io.Writer) error {
	g, err := c.resolve(ctx, &c.Conn)
	if err != nil {
		return err
	}
	name, user := "hiloop", ""
	if c.ID != "" {
		name, user = c.ID, "\n    User "+c.ID
	}
	fmt.Fprintf(stdout, "# ~/.ssh/config\nHost %s\n    HostName %s\n    Port %s%s\n    HostKeyAlias %s\n    StrictHostKeyChecking yes\n\n", name, g.host, g.port, user, g.alias)
	fmt.Fprintf(stdout, "# ~/.ssh/known_hosts\n%s\n", g.knownHosts)
	return nil
}

// SandboxSSHCmd runs the system ssh into a sandbox.
type SandboxSSHCmd struct {
	Conn         `embed:""`
	gatewayFlags `embed:""`
	ID           string   `arg:"" help:"Sandbox id."`
	Identity     string   `short:"i" default:"" help:"Identity (private key) file, as ssh -i; only it is offered."`
	Forward      []string `short:"L" help:"Forward a local port, as ssh -L [bind:]port:host:hostport; repeatable."`
	Command      []string `arg:"" optional:"" passthrough:"" help:"Command to run, after --; a shell when none."`
}

// Run replaces hiloop with ssh, so the exit status is ssh's (the command's,
// or 255 for ssh's own failures). The gateway's host key is pinned in a
// known_hosts file hiloop writes from the authenticated API.
func (c *SandboxSSHCmd) Run(ctx context.Context) error {
	g, err := c.resolve(ctx, &c.Conn)
	if err != nil {
		return execFailure{err}
	}
	sshPath, err := exec.LookPath("ssh")
	if err != nil {
		return execFailure{errors.New("no ssh client on PATH (Debian: apt-get install openssh-client)")}
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, "hiloop")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return execFailure{err}
	}
	known := filepath.Join(dir, g.alias+".known_hosts")
	if err := os.WriteFile(known, []byte(g.knownHosts+"\n"), 0o600); err != nil {
		return execFailure{err}
	}
	argv := []string{"ssh", "-p", g.port, "-o", "HostKeyAlias=" + g.alias, "-o", "UserKnownHostsFile=" + known,
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes"}
	if c.Identity != "" {
		argv = append(argv, "-i", c.Identity, "-o", "IdentitiesOnly=yes")
	}
	for _, f := range c.Forward {
		argv = append(argv, "-L", f)
	}
	argv = append(argv, c.ID+"@"+g.host)
	cmd := c.Command
	if len(cmd) > 0 && cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) > 0 {
		argv = append(append(argv, "--"), cmd...)
	}
	return execFailure{syscall.Exec(sshPath, argv, os.Environ())}
}

// SSHRotateCmd rotates the key the gateway logs in to session helpers with.
type SSHRotateCmd struct {
	offline
	Kubeconfig     string        `default:"" env:"HILOOP_KUBECONFIG" help:"Kubeconfig file (default: in-cluster, then KUBECONFIG and ~/.kube/config)."`
	Namespace      string        `default:"${default_namespace}" env:"HILOOP_NAMESPACE" help:"Namespace that holds the sandboxes."`
	ClusterTimeout time.Duration `default:"${default_cluster_timeout}" env:"HILOOP_CLUSTER_TIMEOUT" help:"How long each call to the cluster may take."`
}

// Run rotates the key (control.RotateGatewayKey).
func (c *SSHRotateCmd) Run(ctx context.Context, stdout io.Writer) error {
	if c.ClusterTimeout <= 0 {
		return usageError{errors.New("--cluster-timeout: must be positive")}
	}
	cfg, err := k8s.LoadConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	clients, err := k8s.NewClients(cfg)
	if err != nil {
		return err
	}
	w, err := k8s.NewWriter(clients, k8s.RenderOptions{Namespace: c.Namespace, RuntimeClass: k8s.DefaultRuntimeClass})
	if err != nil {
		return err
	}
	return c.withDB(ctx, func(ctx context.Context, db *store.Store) error {
		pub, n, err := control.RotateGatewayKey(ctx, db, w, c.ClusterTimeout)
		switch {
		case err != nil && pub == nil:
			return err
		case err != nil:
			return fmt.Errorf("new key %s recorded; %d sandboxes annotated before: %w (run again to finish)", gossh.FingerprintSHA256(pub), n, err)
		}
		fmt.Fprintf(stdout, "gateway key is now %s; %d sandboxes with a session helper annotated\n", gossh.FingerprintSHA256(pub), n)
		return nil
	})
}
