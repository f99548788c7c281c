package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/hiloop/hiloop/api"
)

// SandboxExecCmd runs a command in a sandbox, streaming its I/O.
type SandboxExecCmd struct {
	Conn        `embed:""`
	ID          string        `arg:"" help:"Sandbox id."`
	Interactive bool          `short:"i" help:"Pass stdin to the command."`
	TTY         bool          `short:"t" help:"Allocate a terminal (implies -i); the local one goes raw and its size follows."`
	Timeout     time.Duration `default:"0s" help:"Kill the command after this long (default: no limit but the server's)."`
	Wake        bool          `help:"Start the sandbox first if it was stopped for idleness, and wait for it."`
	Env         []string      `sep:"none" placeholder:"NAME=VALUE" help:"Add NAME=VALUE to the command's environment, exactly as given (no shell reads it); repeatable. Needs sh in the image."`
	Cwd         string        `placeholder:"DIR" help:"Run the command in DIR, an absolute path in the sandbox. Needs sh in the image."`
	Command     []string      `arg:"" passthrough:"" help:"Command and arguments, after --."`
}

// parseEnv reads repeated NAME=VALUE flags into an environment, splitting
// each at its first '=': the value may hold any other. The server checks
// the names.
func parseEnv(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("%s %q: want NAME=VALUE", flag, kv)}
		}
		if _, dup := env[k]; dup {
			return nil, usageError{fmt.Errorf("%s: %s given twice", flag, k)}
		}
		env[k] = v
	}
	return env, nil
}

// exitCode makes hiloop exit with a remote command's own code.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// execFailure is hiloop's own failure during exec: exit 255, like ssh.
type execFailure struct{ error }

// ExitCode makes kong exit 255.
func (execFailure) ExitCode() int { return 255 }

// Run runs the command and returns its exit code as an exitCode. ctx ends
// on SIGINT or SIGTERM, which cancels the remote command.
func (c *SandboxExecCmd) Run(ctx context.Context) error {
	if len(c.Command) > 0 && c.Command[0] == "--" {
		c.Command = c.Command[1:]
	}
	if len(c.Command) == 0 {
		return usageError{errors.New("no command: hiloop sandbox exec ID -- CMD ARGS...")}
	}
	env, err := parseEnv("--env", c.Env)
	if err != nil {
		return err
	}
	o := api.ExecOptions{Command: c.Command, Stdout: os.Stdout, Stderr: os.Stderr, TTY: c.TTY, Timeout: c.Timeout, Env: env, Cwd: c.Cwd}
	// A terminal without input is of no use; -t implies -i, as in ssh.
	if c.Interactive || c.TTY {
		o.Stdin = os.Stdin
	}
	if c.TTY {
		restore, resize, err := localTerminal()
		if err != nil {
			return execFailure{err}
		}
		defer restore()
		o.Resize = resize
	}
	client := c.api()
	client.NoWake = !c.Wake
	st, err := client.Exec(ctx, c.ID, o)
	switch {
	case err == nil:
		return exitCode(st.Code)
	case ctx.Err() != nil:
		// Ctrl-C (without -t) cancels the remote command.
		return exitCode(130)
	default:
		return execFailure{err}
	}
}

// localTerminal puts the local terminal in raw mode (when stdin is one) and
// reports its size now and on every SIGWINCH until restore is called.
func localTerminal() (restore func(), resize <-chan api.ResizeFrame, err error) {
	in := int(os.Stdin.Fd())
	unraw := func() {}
	if term.IsTerminal(in) {
		old, err := term.MakeRaw(in)
		if err != nil {
			return nil, nil, fmt.Errorf("raw terminal: %w", err)
		}
		unraw = func() { term.Restore(in, old) }
	}
	sizes := make(chan api.ResizeFrame, 1)
	sendSize := func() {
		if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil && w > 0 && h > 0 {
			select {
			case sizes <- api.ResizeFrame{Width: uint16(w), Height: uint16(h)}:
			default:
			}
		}
	}
	sendSize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				sendSize()
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(done)
		unraw()
	}, sizes, nil
}
