package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"

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

// ProbeCmd prints what serve's runtime attestation reads (the first line of
// /proc/version) from inside a sandbox pod: run in the session helper's
// container, it needs no shell or cat of the tenant's image, and it is
// hiloop's own binary, which the workload's image cannot replace.
type ProbeCmd struct{}

// maxProbeLine bounds what the probe reads and prints.
const maxProbeLine = 4096

// Run prints the line.
func (ProbeCmd) Run(stdout io.Writer) error {
	f, err := os.Open("/proc/version")
	if err != nil {
		return err
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(io.LimitReader(f, maxProbeLine), maxProbeLine).ReadString('\n')
	if err != nil && err != io.EOF {
		return err
	}
	_, err = fmt.Fprintln(stdout, strings.TrimRight(line, "\n"))
	return err
}
