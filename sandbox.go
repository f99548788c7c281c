package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/hiloop/hiloop/api"
)

// Conn says where the API is and who calls it.
type Conn struct {
	URL          string `default:"http://127.0.0.1:8080" env:"HILOOP_URL" help:"URL of the hiloop API."`
	Token        string `env:"HILOOP_TOKEN" help:"API key."`
	InsecureHTTP bool   `name:"insecure-http" env:"HILOOP_INSECURE_HTTP" help:"Allow a plain http:// URL to a host that is not loopback: the API key then crosses the network in clear text."`
}

// api is the CLI's client. Unlike the SDKs' default, it wakes no sandbox
// stopped for idleness unless a command is told to (sandbox exec --wake).
func (c *Conn) api() *api.Client {
	return &api.Client{URL: c.URL, Token: c.Token, InsecureHTTP: c.InsecureHTTP, NoWake: true}
}

// Client flags shared by the commands that talk to the API and print.
type Client struct {
	Conn   `embed:""`
	Output string `short:"o" default:"table" enum:"table,json" help:"Output format: table or json."`
}

func (c *Client) print(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	if c.Output == "json" {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(terminalSafeJSON(b), '\n'))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// terminalSafeJSON escapes, as \uXXXX, what encoding/json leaves raw in
// JSON it wrote and a terminal may act on rather than show: DEL, the C1
// controls (U+009B is CSI) and the format characters that reorder or hide
// text (U+202E, U+200B); it escapes the C0 controls itself, and the line
// breaks left are the indentation's. Outside strings JSON is ASCII, so
// each is inside a string and the value reads back the same.
func terminalSafeJSON(b []byte) []byte {
	unsafe := func(r rune) bool { return r == 0x7f || r > 0x7f && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r)) }
	if bytes.IndexFunc(b, unsafe) < 0 {
		return b
	}
	out := make([]byte, 0, len(b)+64)
	for _, r := range string(b) {
		if !unsafe(r) {
			out = utf8.AppendRune(out, r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}

func sandboxRows(tw *tabwriter.Writer, list ...api.Sandbox) {
	fmt.Fprintln(tw, "ID\tSTATE\tDESIRED\tIMAGE\tEXPIRES\tREASON")
	for _, sb := range list {
		state := string(sb.State)
		if sb.Anomaly != "" {
			state += "/" + sb.Anomaly
		}
		// Who stopped it, when that is not its owner: a sandbox stopped
		// for idleness wakes on its owner's next use.
		if (sb.State == api.StateStopped || sb.State == api.StateStopping) && sb.StoppedBy != "" && sb.StoppedBy != api.StoppedByUser {
			state += " (" + sb.StoppedBy + ")"
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
	Create  SandboxCreateCmd  `cmd:"" help:"Create a sandbox."`
	List    SandboxListCmd    `cmd:"" help:"List sandboxes."`
	Get     SandboxGetCmd     `cmd:"" help:"Show one sandbox."`
	Stop    SandboxStopCmd    `cmd:"" help:"Stop a sandbox (volumes survive, processes do not)."`
	Start   SandboxStartCmd   `cmd:"" help:"Start a stopped sandbox."`
	Ttl     SandboxTTLCmd     `cmd:"" name:"ttl" help:"Set a sandbox's TTL from now."`
	Idle    SandboxIdleCmd    `cmd:"" name:"idle-timeout" help:"Set a sandbox's idle timeout (0 turns idle stop off)."`
	Touch   SandboxTouchCmd   `cmd:"" help:"Count a use of a sandbox now, so its idle clock starts again."`
	Delete  SandboxDeleteCmd  `cmd:"" help:"Delete a sandbox."`
	Wait    SandboxWaitCmd    `cmd:"" help:"Wait until a sandbox reaches a state."`
	Events  SandboxEventsCmd  `cmd:"" help:"Show a sandbox's state history."`
	Exec    SandboxExecCmd    `cmd:"" help:"Run a command in a sandbox and exit with its exit code."`
	Cp      SandboxCpCmd      `cmd:"" name:"cp" help:"Copy a file or directory into (PATH SANDBOX:/abs/path) or out of (SANDBOX:/abs/path PATH) a sandbox."`
	SSH     SandboxSSHCmd     `cmd:"" name:"ssh" help:"ssh into a sandbox through the gateway, host key pinned; exits with ssh's code."`
	Process SandboxProcessCmd `cmd:"" help:"Background processes: start, list, get, logs, stdin, kill."`
	FS      SandboxFSCmd      `cmd:"" name:"fs" help:"List, inspect, remove, make and rename files in a sandbox: fs ls|stat|rm|mkdir|mv SANDBOX:/path."`

	Preview       SandboxPreviewCmd       `cmd:"" help:"Serve a port of a sandbox at a preview URL and print the URL."`
	Previews      SandboxPreviewsCmd      `cmd:"" help:"List a sandbox's live previews."`
	PreviewRevoke SandboxPreviewRevokeCmd `cmd:"" name:"preview-revoke" help:"Revoke a sandbox's preview: its URL stops working and its open connections end."`
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
	Env            []string          `sep:"none" placeholder:"NAME=VALUE" help:"Set NAME=VALUE in the sandbox's environment, exactly as given; repeatable."`
	IdempotencyKey string            `help:"Idempotency-Key: a retry with the same key never makes a second sandbox."`
	IdleTimeout    string            `name:"idle-timeout" help:"Stop the sandbox once nobody used it through hiloop for this long, such as 30m (0: never; default: the organization's, else the deployment's). ssh, ssh -L and exec --wake start it again."`
	Wait           bool              `help:"Wait until the sandbox runs, showing its progress."`
	Timeout        time.Duration     `default:"5m" help:"How long --wait waits."`
}

// Run creates the sandbox.
func (c *SandboxCreateCmd) Run(ctx context.Context, stdout io.Writer) error {
	req := api.CreateSandboxRequest{Image: c.Image, TTL: c.TTL, ShutdownPolicy: c.ShutdownPolicy, Labels: c.Label, Transports: c.Transport,
		IdleTimeout: c.IdleTimeout}
	env, err := parseEnv("--env", c.Env)
	if err != nil {
		return err
	}
	req.Env = env
	if c.CPU != "" || c.CPULimit != "" || c.Memory != "" || c.MemoryLimit != "" {
		req.Resources = &api.Resources{CPURequest: c.CPU, CPULimit: c.CPULimit, MemoryRequest: c.Memory, MemoryLimit: c.MemoryLimit}
	}
	for _, v := range c.Volume {
		parts := strings.Split(v, ":")
		if len(parts) < 3 || len(parts) > 4 {
			return fmt.Errorf("--volume %q: want NAME:SIZE:MOUNTPATH[:STORAGECLASS]", v)
		}
		vr := api.VolumeRequest{Name: parts[0], Size: parts[1], MountPath: parts[2]}
		if len(parts) == 4 {
			vr.StorageClass = parts[3]
		}
		req.Volumes = append(req.Volumes, vr)
	}
	sb, err := c.api().CreateSandbox(ctx, req, c.IdempotencyKey)
	if err != nil {
		return err
	}
	if c.Wait {
		sb, err = waitFor(ctx, c.api(), sb.ID, api.StateRunning, c.Timeout)
		if err != nil {
			return err
		}
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// waitFor waits for a state, showing progress on stderr: one line rewritten
// in place on a terminal, one line per state otherwise.
func waitFor(ctx context.Context, client *api.Client, id string, want api.State, timeout time.Duration) (api.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tty := term.IsTerminal(int(os.Stderr.Fd()))
	var trail []string
	start := time.Now()
	sb, err := client.WaitProgress(ctx, id, want, func(sb api.Sandbox) {
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
func (c *SandboxListCmd) Run(ctx context.Context, stdout io.Writer) error {
	o := api.ListOptions{State: api.State(c.State), Limit: c.Limit, After: c.After}
	for _, l := range c.Label {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return usageError{fmt.Errorf("--label %q: want KEY=VALUE", l)}
		}
		if o.Labels == nil {
			o.Labels = map[string]string{}
		}
		o.Labels[k] = v
	}
	var all []api.Sandbox
	next := ""
	for {
		page, err := c.api().ListSandboxes(ctx, o)
		if err != nil {
			return err
		}
		all = append(all, page.Items...)
		next = page.Next
		if !c.All || page.Next == "" {
			break
		}
		o.After = page.Next
	}
	return c.print(stdout, api.SandboxList{Items: all, Next: next}, func(tw *tabwriter.Writer) {
		sandboxRows(tw, all...)
		if next != "" {
			tw.Flush()
			fmt.Fprintf(os.Stderr, "more: --after %s (or --all)\n", next)
		}
	})
}

// sandboxArg is a command that acts on one sandbox and prints it.
type sandboxArg struct {
	Client `embed:""`
	ID     string `arg:"" help:"Sandbox id."`
}

// show prints the sandbox an API call returned.
func (c *sandboxArg) show(stdout io.Writer, sb api.Sandbox, err error) error {
	if err != nil {
		return err
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) { sandboxRows(tw, sb) })
}

// SandboxGetCmd shows one sandbox.
type SandboxGetCmd struct{ sandboxArg }

// Run shows the sandbox.
func (c *SandboxGetCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().Sandbox(ctx, c.ID)
	if err != nil || c.Output == "json" {
		return c.show(stdout, sb, err)
	}
	return c.print(stdout, sb, func(tw *tabwriter.Writer) {
		sandboxRows(tw, sb)
		// The promise beside what was seen inside the pod.
		fmt.Fprintln(tw)
		if sb.Isolation != "" {
			fmt.Fprintf(tw, "Isolation:\t%s\n", sb.Isolation)
		}
		if sb.RuntimeObserved != "" {
			observed := sb.RuntimeObserved
			if sb.KernelRelease != "" {
				observed += " (kernel " + api.Printable(sb.KernelRelease) + ")"
			}
			fmt.Fprintf(tw, "Runtime observed:\t%s\n", observed)
		}
	})
}

// SandboxEventsCmd shows a sandbox's history.
type SandboxEventsCmd struct{ sandboxArg }

// Run shows the events.
func (c *SandboxEventsCmd) Run(ctx context.Context, stdout io.Writer) error {
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

// SandboxStopCmd stops a sandbox.
type SandboxStopCmd struct{ sandboxArg }

// Run stops it.
func (c *SandboxStopCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().StopSandbox(ctx, c.ID)
	return c.show(stdout, sb, err)
}

// SandboxStartCmd starts a sandbox.
type SandboxStartCmd struct {
	sandboxArg
	Wait    bool          `help:"Wait until the sandbox runs, showing its progress."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
}

// Run starts it.
func (c *SandboxStartCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().StartSandbox(ctx, c.ID)
	if err == nil && c.Wait {
		sb, err = waitFor(ctx, c.api(), c.ID, api.StateRunning, c.Timeout)
	}
	return c.show(stdout, sb, err)
}

// SandboxDeleteCmd deletes a sandbox.
type SandboxDeleteCmd struct{ sandboxArg }

// Run deletes it.
func (c *SandboxDeleteCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().DeleteSandbox(ctx, c.ID)
	return c.show(stdout, sb, err)
}

// SandboxTTLCmd sets a TTL.
type SandboxTTLCmd struct {
	sandboxArg
	TTL string `arg:"" name:"ttl" help:"New time to live from now, such as 4h."`
}

// Run sets the TTL.
func (c *SandboxTTLCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().UpdateTTL(ctx, c.ID, c.TTL)
	return c.show(stdout, sb, err)
}

// SandboxIdleCmd sets an idle timeout.
type SandboxIdleCmd struct {
	sandboxArg
	IdleTimeout string `arg:"" name:"duration" help:"Stop the sandbox once nobody used it for this long, such as 30m; 0 turns idle stop off."`
}

// Run sets the idle timeout.
func (c *SandboxIdleCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().UpdateSandbox(ctx, c.ID, api.UpdateSandboxRequest{IdleTimeout: c.IdleTimeout})
	return c.show(stdout, sb, err)
}

// SandboxTouchCmd counts a use of a sandbox.
type SandboxTouchCmd struct{ sandboxArg }

// Run touches it.
func (c *SandboxTouchCmd) Run(ctx context.Context, stdout io.Writer) error {
	sb, err := c.api().TouchSandbox(ctx, c.ID)
	return c.show(stdout, sb, err)
}

// SandboxWaitCmd waits for a state.
type SandboxWaitCmd struct {
	sandboxArg
	For     string        `default:"running" help:"State to wait for."`
	Timeout time.Duration `default:"5m" help:"How long to wait."`
}

// Run waits.
func (c *SandboxWaitCmd) Run(ctx context.Context, stdout io.Writer) error {
	if !slices.Contains(api.States, api.State(c.For)) {
		return usageError{fmt.Errorf("--for: %q is not a state", c.For)}
	}
	sb, err := waitFor(ctx, c.api(), c.ID, api.State(c.For), c.Timeout)
	return c.show(stdout, sb, err)
}
