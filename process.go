package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hiloop/hiloop/api"
)

// SandboxProcessCmd groups the commands of background processes.
type SandboxProcessCmd struct {
	Start ProcessStartCmd `cmd:"" help:"Start a command in the background in a sandbox; it outlives this call."`
	List  ProcessListCmd  `cmd:"" help:"List a sandbox's processes."`
	Get   ProcessGetCmd   `cmd:"" help:"Show one process."`
	Logs  ProcessLogsCmd  `cmd:"" help:"Print a process's output (stdout and stderr together); -f follows it and exits with the process's exit code."`
	Stdin ProcessStdinCmd `cmd:"" help:"Write this command's stdin to a process's stdin."`
	Kill  ProcessKillCmd  `cmd:"" help:"Kill a process (KILL), or send it another signal with -s."`
}

func processRows(tw *tabwriter.Writer, list ...api.Process) {
	fmt.Fprintln(tw, "ID\tSTATE\tEXIT\tSTARTED\tCOMMAND")
	for _, p := range list {
		exit := "-"
		switch {
		case p.ExitCode != nil:
			exit = fmt.Sprint(*p.ExitCode)
		case p.Reason != "":
			exit = p.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.ID, p.State, exit, p.StartedAt.Local().Format(time.DateTime),
			api.Printable(strings.Join(p.Command, " ")))
	}
}

// processArg names a sandbox and one of its processes.
type processArg struct {
	Client `embed:""`
	ID     string `arg:"" help:"Sandbox id."`
	PID    string `arg:"" name:"process" help:"Process id (proc_...)."`
}

// ProcessStartCmd starts a background process.
type ProcessStartCmd struct {
	Client  `embed:""`
	ID      string   `arg:"" help:"Sandbox id."`
	Wake    bool     `help:"Start the sandbox first if it was stopped for idleness, and wait for it."`
	Env     []string `sep:"none" placeholder:"NAME=VALUE" help:"Add NAME=VALUE to the process's environment, exactly as given (no shell reads it); repeatable."`
	Cwd     string   `placeholder:"DIR" help:"Start the process in DIR, an absolute path in the sandbox."`
	Command []string `arg:"" passthrough:"" help:"Command and arguments, after --."`
}

// Run starts the process and prints it.
func (c *ProcessStartCmd) Run(ctx context.Context, stdout io.Writer) error {
	if len(c.Command) > 0 && c.Command[0] == "--" {
		c.Command = c.Command[1:]
	}
	if len(c.Command) == 0 {
		return usageError{errors.New("no command: hiloop sandbox process start ID -- CMD ARGS...")}
	}
	env, err := parseEnv("--env", c.Env)
	if err != nil {
		return err
	}
	client := c.api()
	client.NoWake = !c.Wake
	p, err := client.StartProcessWith(ctx, c.ID, api.StartProcessRequest{Command: c.Command, Env: env, Cwd: c.Cwd})
	if err != nil {
		return err
	}
	return c.print(stdout, p, func(tw *tabwriter.Writer) { processRows(tw, p) })
}

// ProcessListCmd lists a sandbox's processes.
type ProcessListCmd struct{ sandboxArg }

// Run lists them.
func (c *ProcessListCmd) Run(ctx context.Context, stdout io.Writer) error {
	list, err := c.api().Processes(ctx, c.ID)
	if err != nil {
		return err
	}
	return c.print(stdout, api.ProcessList{Items: list}, func(tw *tabwriter.Writer) { processRows(tw, list...) })
}

// ProcessGetCmd shows one process.
type ProcessGetCmd struct{ processArg }

// Run shows it.
func (c *ProcessGetCmd) Run(ctx context.Context, stdout io.Writer) error {
	p, err := c.api().Process(ctx, c.ID, c.PID)
	if err != nil {
		return err
	}
	return c.print(stdout, p, func(tw *tabwriter.Writer) { processRows(tw, p) })
}

// ProcessLogsCmd prints a process's output.
type ProcessLogsCmd struct {
	Conn   `embed:""`
	ID     string `arg:"" help:"Sandbox id."`
	PID    string `arg:"" name:"process" help:"Process id (proc_...)."`
	Follow bool   `short:"f" help:"Follow the output until the process ends, then exit with its exit code."`
	Offset int64  `default:"0" help:"Byte offset to start from."`
}

// attachTries bounds how often logs -f attaches again after its stream
// was cut without any output coming through.
const attachTries = 3

// Run copies the output to stdout. With -f it attaches again from where
// it got after a cut, and exits with the process's exit code once it
// ended (255 when it ended without one, as when its sandbox stopped).
func (c *ProcessLogsCmd) Run(ctx context.Context) error {
	client := c.api()
	offset, tries := c.Offset, 0
	for {
		out, err := client.ProcessOutput(ctx, c.ID, c.PID, offset, c.Follow)
		if err != nil {
			return err
		}
		start := out.Offset
		_, err = io.Copy(os.Stdout, out)
		out.Close()
		offset = out.Offset
		if !c.Follow {
			return err
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return exitCode(130)
		}
		if offset == start {
			if tries++; tries >= attachTries {
				return err
			}
		} else {
			tries = 0
		}
	}
	p, err := client.Process(ctx, c.ID, c.PID)
	switch {
	case err != nil:
		return err
	case p.ExitCode != nil:
		return exitCode(*p.ExitCode)
	}
	fmt.Fprintf(os.Stderr, "hiloop: the process %s (%s)\n", p.State, p.Reason)
	return execFailure{fmt.Errorf("the process ended without an exit code: %s", p.Reason)}
}

// ProcessStdinCmd writes to a process's stdin.
type ProcessStdinCmd struct {
	Conn  `embed:""`
	ID    string `arg:"" help:"Sandbox id."`
	PID   string `arg:"" name:"process" help:"Process id (proc_...)."`
	Close bool   `help:"Close the process's stdin after, so it reads end of file."`
}

// Run sends this command's stdin, in pieces of at most
// api.MaxProcessStdin bytes, until its end.
func (c *ProcessStdinCmd) Run(ctx context.Context) error {
	client := c.api()
	buf := make([]byte, api.MaxProcessStdin)
	for {
		n, rerr := io.ReadFull(os.Stdin, buf)
		last := rerr != nil
		if n > 0 || last && c.Close {
			if err := client.WriteStdin(ctx, c.ID, c.PID, buf[:n], last && c.Close); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// ProcessKillCmd kills a process or sends it a signal.
type ProcessKillCmd struct {
	processArg
	Signal string `short:"s" default:"KILL" help:"Signal to send: TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT."`
}

// Run sends the signal and prints the process.
func (c *ProcessKillCmd) Run(ctx context.Context, stdout io.Writer) error {
	sig := strings.ToUpper(strings.TrimPrefix(strings.ToUpper(c.Signal), "SIG"))
	if !api.ValidSignal(sig) {
		return usageError{fmt.Errorf("-s %s: not one of %s", c.Signal, strings.Join(api.ProcessSignals(), ", "))}
	}
	var p api.Process
	var err error
	if sig == "KILL" {
		p, err = c.api().KillProcess(ctx, c.ID, c.PID)
	} else {
		p, err = c.api().SignalProcess(ctx, c.ID, c.PID, sig)
	}
	if err != nil {
		return err
	}
	return c.print(stdout, p, func(tw *tabwriter.Writer) { processRows(tw, p) })
}
