package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/hiloop/hiloop/api"
)

// SandboxCpCmd copies files and directories into and out of a sandbox.
type SandboxCpCmd struct {
	Conn      `embed:""`
	Recursive bool   `short:"r" help:"Copy a directory out of a sandbox (so does a remote path that ends in /)."`
	Overwrite bool   `help:"Let a directory from a sandbox go into a local directory that exists, replacing the files it names. Without it, a sandbox's directory is never merged into a local one."`
	MaxBytes  int64  `name:"max-bytes" default:"1073741824" help:"The most bytes a download from a sandbox may write here, whatever it declares."`
	Src       string `arg:"" help:"What to copy: a local path, or SANDBOX:/abs/path."`
	Dst       string `arg:"" help:"Where to: SANDBOX:/abs/path, or a local path."`
}

// remoteRE is SANDBOX:/abs/path.
var remoteRE = regexp.MustCompile(`^(sbx_[A-Za-z0-9]+):(/.*)$`)

// Run copies. A local directory goes in as a tar stream and a remote one
// comes out as one; a local destination that is an existing directory
// receives the file or directory under its own name, as cp does.
func (c *SandboxCpCmd) Run(ctx context.Context, stdout io.Writer) error {
	src, dst := remoteRE.FindStringSubmatch(c.Src), remoteRE.FindStringSubmatch(c.Dst)
	switch {
	case src == nil && dst != nil:
		return c.upload(ctx, c.Src, dst[1], dst[2])
	case src != nil && dst == nil:
		return c.download(ctx, src[1], src[2], c.Dst)
	}
	return usageError{errors.New("copy between a local path and SANDBOX:/abs/path: hiloop sandbox cp ./file sbx_...:/path, or sbx_...:/path ./file")}
}

func (c *SandboxCpCmd) upload(ctx context.Context, local, id, remote string) error {
	fi, err := os.Stat(local)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_, err := c.api().UploadDir(ctx, id, local, remote)
		return err
	}
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	bar := newProgress("upload "+filepath.Base(local), fi.Size())
	defer bar.done()
	_, err = c.api().WriteFile(ctx, id, remote, bar.reader(f), fi.Size(), fi.Mode().Perm())
	return err
}

// download copies the file or directory at remote to local. What the
// sandbox sends is hostile, down to what kind of thing remote is: a path
// that turns out to be a directory needs -r (or a trailing /), and lands
// as a new directory, never merged into one that exists.
func (c *SandboxCpCmd) download(ctx context.Context, id, remote, local string) error {
	wantDir := strings.HasSuffix(remote, "/")
	if remote != "/" {
		remote = strings.TrimSuffix(remote, "/")
	}
	// Its last name is the local one, so .. would land beside the
	// destination: hiloop refuses such a path, but another server may not.
	if path.Clean(remote) != remote {
		return usageError{fmt.Errorf("%s:%s: a sandbox path is absolute and clean, without . or .. or //", id, remote)}
	}
	fr, err := c.api().ReadFile(ctx, id, remote)
	if err != nil {
		return err
	}
	defer fr.Close()
	name := path.Base(remote)
	switch {
	case fr.Dir && !c.Recursive && !wantDir:
		return fmt.Errorf("%s:%s is a directory: copy it with -r", id, remote)
	case !fr.Dir && wantDir:
		return fmt.Errorf("%s:%s/ is not a directory", id, remote)
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() && name != "/" {
		local = filepath.Join(local, name)
	}
	bar := newProgress("download "+name, fr.Size)
	defer bar.done()
	if fr.Dir {
		err := api.ExtractTar(bar.reader(fr), local, api.ExtractOptions{Overwrite: c.Overwrite, MaxBytes: c.MaxBytes})
		if errors.Is(err, api.ErrDestinationExists) && !c.Overwrite {
			return fmt.Errorf("%w; copy to a new name, or pass --overwrite", err)
		}
		return err
	}
	// The file appears at its path only once it arrived whole.
	if err := api.SaveFile(bar.reader(fr), local, c.MaxBytes); err != nil {
		return fmt.Errorf("download %s: %w", remote, err)
	}
	return nil
}

// progressFrom is the size from which a transfer shows a progress bar.
const progressFrom = 8 << 20

// progress draws a transfer's progress on stderr, when stderr is a
// terminal and the transfer is large (or of unknown size).
type progress struct {
	label string
	total int64
	n     int64
	start time.Time
	last  time.Time
	on    bool
}

func newProgress(label string, total int64) *progress {
	on := term.IsTerminal(int(os.Stderr.Fd())) && (total < 0 || total >= progressFrom)
	return &progress{label: label, total: total, start: time.Now(), on: on}
}

func (p *progress) reader(r io.Reader) io.Reader {
	if !p.on {
		return r
	}
	return progressReader{r, p}
}

type progressReader struct {
	r io.Reader
	p *progress
}

func (pr progressReader) Read(b []byte) (int, error) {
	n, err := pr.r.Read(b)
	pr.p.add(int64(n))
	return n, err
}

func (p *progress) add(n int64) {
	p.n += n
	if time.Since(p.last) >= 100*time.Millisecond {
		p.last = time.Now()
		p.draw()
	}
}

func (p *progress) draw() {
	rate := float64(p.n) / max(time.Since(p.start).Seconds(), 1e-3)
	line := fmt.Sprintf("%s  %s  %s/s", p.label, mib(p.n), mib(int64(rate)))
	if p.total > 0 {
		const width = 30
		filled := int(width * p.n / p.total)
		line = fmt.Sprintf("%s [%s%s] %3d%%  %s/%s  %s/s", p.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled),
			100*p.n/p.total, mib(p.n), mib(p.total), mib(int64(rate)))
	}
	fmt.Fprintf(os.Stderr, "\r\033[K%s", line)
}

func (p *progress) done() {
	if p.on {
		p.draw()
		fmt.Fprintln(os.Stderr)
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
