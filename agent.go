package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"

	"github.com/hiloop/hiloop/agent"
)

// AgentCmd runs the session helper inside a sandbox pod.
type AgentCmd struct {
	Listen         string `default:":2223" env:"HILOOP_AGENT_LISTEN" help:"Address to listen on (the pod's session port)."`
	AuthorizedKeys string `required:"" env:"HILOOP_AGENT_AUTHORIZED_KEYS" help:"File with the gateway's public key for this sandbox, projected from the pod annotation; re-read at every connection."`
	Sandbox        string `required:"" env:"HILOOP_AGENT_SANDBOX" help:"Id of the sandbox whose pod this helper runs in (from the pod's label, through the downward API); the only sandbox it accepts the gateway for (the TLS server name)."`
}

// Run serves until SIGINT or SIGTERM.
func (c *AgentCmd) Run(ctx context.Context) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The TLS leg allocates about 400 bytes per 64 KB forwarded (the SSH
	// leg before it allocated 80 KB, and ran at GOGC 800), so the default
	// GOGC is enough; the soft memory limit keeps the heap well inside the
	// helper's 64Mi limit. GOMEMLIMIT in the environment wins.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(40 << 20)
	}
	a, err := agent.New(agent.Options{SandboxID: c.Sandbox, AuthorizedKeysFile: c.AuthorizedKeys, Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	log.Info("session helper listening", "addr", ln.Addr().String(), "sandbox", c.Sandbox)
	return a.Serve(ctx, ln)
}
