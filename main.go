// Command hiloop is a self-hosted control plane for untrusted sandboxes on
// Kubernetes: one sandbox is one gVisor pod described by an agent-sandbox
// Sandbox. One binary serves the API, mirrors observed state into an embedded
// SQLite record, and is also the CLI.
//
// The grammar is split by command group: serve.go (serve, dev; what they
// run is package app), sandbox.go, exec.go (sandbox exec and its terminal),
// fs.go (sandbox fs), admin.go (org, key, backup), ssh.go (ssh-key,
// ssh-config, ssh-rotate-agent-key, sandbox ssh), agent.go (the in-pod
// session helper).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/app"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// CLI is the whole command-line grammar.
type CLI struct {
	Serve     ServeCmd     `cmd:"" help:"Run the control plane: HTTP API, status mirror and product record."`
	Dev       DevCmd       `cmd:"" help:"Start a local cluster (no Docker needed) and serve against it: its node runs sandboxes under gVisor where this machine can, else simulates them (--node)."`
	Sandbox   SandboxCmd   `cmd:"" help:"Create, inspect and control sandboxes through the API."`
	Org       OrgCmd       `cmd:"" help:"Manage organizations in the database file (offline admin)."`
	Key       KeyCmd       `cmd:"" help:"Manage API keys: offline with --db, or your own org's through the API."`
	SSHKey    SSHKeyCmd    `cmd:"" name:"ssh-key" help:"Register and remove your organization's SSH public keys."`
	SSHConfig SSHConfigCmd `cmd:"" name:"ssh-config" help:"Print a Host block for ~/.ssh/config and the gateway's pinned host key."`
	SSHRotate SSHRotateCmd `cmd:"" name:"ssh-rotate-agent-key" help:"Give the gateway a new key for session helpers and hand it to every sandbox (offline admin)."`
	Agent     AgentCmd     `cmd:"" help:"Run the session helper (inside a sandbox pod)."`
	Probe     ProbeCmd     `cmd:"" name:"runtime-probe" hidden:"" help:"Print the first line of /proc/version (serve's runtime attestation runs it in the session helper's container)."`
	Backup    BackupCmd    `cmd:"" help:"Copy the product record online, consistently, and check the copy (offline admin)."`
	Doctor    DoctorCmd    `cmd:"" help:"Check the cluster's isolation boundary as serve does; print every check and the fix for each failure (exit 1 on any)."`
	Version   VersionCmd   `cmd:"" help:"Print the version."`
}

// VersionCmd prints the version.
type VersionCmd struct{}

// Run prints the version.
func (VersionCmd) Run(stdout io.Writer) error {
	fmt.Fprintf(stdout, "hiloop %s\n", version)
	return nil
}

// usageError is a bad flag or argument found after parsing: exit 2.
type usageError struct{ error }

// ExitCode makes kong exit 2, as for a parse error.
func (usageError) ExitCode() int { return 2 }

// newParser is a parser of grammar (CLI, or a cut of it: grammar.go), bound
// to ctx and stdout.
func newParser(ctx context.Context, grammar any, stdout io.Writer) (*kong.Kong, error) {
	return kong.New(grammar,
		kong.Name("hiloop"),
		kong.Description("hiloop runs untrusted sandboxes on Kubernetes, one gVisor pod each, and reaches into them.\n\n"+
			"Run the control plane with `hiloop serve` (or `hiloop dev` for a local cluster);\n"+
			"drive it with `hiloop sandbox ...`, configured by HILOOP_URL and HILOOP_TOKEN."),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Vars(app.Vars()),
		kong.BindTo(stdout, (*io.Writer)(nil)),
		kong.BindTo(ctx, (*context.Context)(nil)),
	)
}

func main() {
	// One context for every command: SIGINT and SIGTERM end it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	parser, kctx, err := parse(ctx, os.Args[1:], os.Stdout)
	if parser == nil {
		panic(err)
	}
	if err != nil {
		// Bad flags and config exit 2 (kong's own default is 80).
		parser.FatalIfErrorf(usageError{err})
	}
	err = kctx.Run()
	var code exitCode
	if errors.As(err, &code) {
		stop()
		os.Exit(int(code))
	}
	if err != nil {
		kctx.FatalIfErrorf(printableError{err})
	}
}

// printableError is an error whose message is made api.Printable before
// it reaches the terminal: it may quote what a sandbox wrote.
type printableError struct{ error }

func (e printableError) Error() string { return api.Printable(e.error.Error()) }
func (e printableError) Unwrap() error { return e.error }
