package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/hiloop/hiloop/api"
)

// SandboxFSCmd groups the file operations in a sandbox, each on
// SANDBOX:/abs/path as sandbox cp names a remote path.
type SandboxFSCmd struct {
	Ls    FSListCmd   `cmd:"" name:"ls" help:"List a directory in a sandbox: SANDBOX:/abs/dir."`
	Stat  FSStatCmd   `cmd:"" help:"Show what SANDBOX:/abs/path is; exit 1 when nothing is there."`
	Rm    FSRemoveCmd `cmd:"" name:"rm" help:"Remove a file, a link or an empty directory in a sandbox; -r a directory and everything in it."`
	Mkdir FSMkdirCmd  `cmd:"" help:"Make a directory and its missing parents in a sandbox (mkdir -p)."`
	Mv    FSMoveCmd   `cmd:"" name:"mv" help:"Rename SANDBOX:/from to /to (or SANDBOX:/to) in the same sandbox."`
}

// fsConn is the connection flags of a file operation, with --wake.
type fsConn struct {
	Conn `embed:""`
	Wake bool `help:"Start the sandbox first if it was stopped for idleness, and wait for it."`
}

func (c *fsConn) client() *api.Client {
	cl := c.api()
	cl.NoWake = !c.Wake
	return cl
}

// fsClient is fsConn with the output format of a command that prints.
type fsClient struct {
	fsConn `embed:""`
	Output string `short:"o" default:"table" enum:"table,json" help:"Output format: table or json."`
}

func (c *fsClient) print(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	return (&Client{Output: c.Output}).print(w, v, table)
}

// remotePath splits SANDBOX:/abs/path.
func remotePath(arg string) (id, p string, err error) {
	m := remoteRE.FindStringSubmatch(arg)
	if m == nil {
		return "", "", usageError{fmt.Errorf("%q: want SANDBOX:/abs/path, such as sbx_...:/work", arg)}
	}
	return m[1], m[2], nil
}

// FSListCmd lists a directory in a sandbox.
type FSListCmd struct {
	fsClient `embed:""`
	Target   string `arg:"" name:"dir" help:"The directory: SANDBOX:/abs/dir."`
}

// Run lists the directory, one entry a line as ls -l does.
func (c *FSListCmd) Run(ctx context.Context, stdout io.Writer) error {
	id, p, err := remotePath(c.Target)
	if err != nil {
		return err
	}
	l, err := c.client().List(ctx, id, p)
	if err != nil {
		return err
	}
	if l.Truncated && c.Output != "json" {
		defer fmt.Fprintf(os.Stderr, "%s has more entries than the %d a listing shows\n", shownName(p), api.MaxListEntries)
	}
	return c.print(stdout, l, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "MODE\tSIZE\tMODIFIED\tNAME")
		for _, e := range l.Entries {
			entryRow(tw, e, e.Name)
		}
	})
}

// FSStatCmd shows what a path in a sandbox is.
type FSStatCmd struct {
	fsClient `embed:""`
	Target   string `arg:"" name:"path" help:"The path: SANDBOX:/abs/path."`
}

// Run shows the path's entry.
func (c *FSStatCmd) Run(ctx context.Context, stdout io.Writer) error {
	id, p, err := remotePath(c.Target)
	if err != nil {
		return err
	}
	e, err := c.client().Stat(ctx, id, p)
	if err != nil {
		return err
	}
	return c.printEntry(stdout, e)
}

// printEntry prints one entry with its path.
func (c *fsClient) printEntry(stdout io.Writer, e api.FileEntry) error {
	return c.print(stdout, e, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "MODE\tSIZE\tMODIFIED\tPATH")
		entryRow(tw, e, e.Path)
	})
}

// entryRow is one entry's line: its mode as ls shows it, its size, its
// modification time and its name.
func entryRow(tw *tabwriter.Writer, e api.FileEntry, name string) {
	fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.FileMode(), e.Size, e.MTime.Local().Format(time.DateTime), shownName(name))
}

// shownName is a name the sandbox chose, fit for a terminal: quoted, with
// Go's escapes, when it holds invalid UTF-8, a space at either end or a
// character Go does not call printable (every control, C1 ones too, and
// the format characters that reorder or hide text, such as U+202E), so
// that a name cannot break a line or a column, send escapes, nor show as
// another name.
func shownName(name string) string {
	printable := func(r rune) bool { return r == ' ' || strconv.IsPrint(r) }
	if !utf8.ValidString(name) || strings.IndexFunc(name, func(r rune) bool { return !printable(r) }) >= 0 ||
		strings.TrimSpace(name) != name || strings.HasPrefix(name, `"`) {
		return strconv.Quote(name)
	}
	return name
}

// FSRemoveCmd removes a path in a sandbox.
type FSRemoveCmd struct {
	fsConn    `embed:""`
	Recursive bool   `short:"r" help:"Remove a directory and everything in it."`
	Target    string `arg:"" name:"path" help:"What to remove: SANDBOX:/abs/path."`
}

// Run removes the path.
func (c *FSRemoveCmd) Run(ctx context.Context) error {
	id, p, err := remotePath(c.Target)
	if err != nil {
		return err
	}
	err = c.client().Remove(ctx, id, p, c.Recursive)
	if api.ErrorCode(err) == api.CodeDirectoryNotEmpty {
		return fmt.Errorf("%w; remove it and everything in it with -r", err)
	}
	return err
}

// FSMkdirCmd makes a directory in a sandbox.
type FSMkdirCmd struct {
	fsClient `embed:""`
	Target   string `arg:"" name:"dir" help:"The directory to make: SANDBOX:/abs/dir."`
}

// Run makes the directory and prints its entry.
func (c *FSMkdirCmd) Run(ctx context.Context, stdout io.Writer) error {
	id, p, err := remotePath(c.Target)
	if err != nil {
		return err
	}
	e, err := c.client().Mkdir(ctx, id, p)
	if err != nil {
		return err
	}
	return c.printEntry(stdout, e)
}

// FSMoveCmd renames a path in a sandbox.
type FSMoveCmd struct {
	fsClient  `embed:""`
	Overwrite bool   `help:"Replace what is at the destination: a file or a link, or an empty directory with a directory."`
	From      string `arg:"" name:"from" help:"What to rename: SANDBOX:/abs/path."`
	To        string `arg:"" name:"to" help:"Its new path: /abs/path, or SANDBOX:/abs/path of the same sandbox."`
}

// Run renames and prints the destination's entry.
func (c *FSMoveCmd) Run(ctx context.Context, stdout io.Writer) error {
	id, from, err := remotePath(c.From)
	if err != nil {
		return err
	}
	to := c.To
	if !strings.HasPrefix(to, "/") {
		toID, p, err := remotePath(to)
		if err != nil {
			return err
		}
		if toID != id {
			return usageError{errors.New("mv renames within one sandbox: copy between sandboxes with sandbox cp")}
		}
		to = p
	}
	e, err := c.client().Rename(ctx, id, from, to, c.Overwrite)
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodePathConflict && strings.HasSuffix(ae.Message, " exists") {
		return fmt.Errorf("%w; replace it with --overwrite", err)
	}
	if err != nil {
		return err
	}
	return c.printEntry(stdout, e)
}
