package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hiloop/hiloop/api"
)

// SandboxPreviewCmd serves a port of a sandbox at a preview URL.
type SandboxPreviewCmd struct {
	sandboxArg
	Port int    `arg:"" help:"TCP port on the sandbox's loopback."`
	Auth string `default:"token" enum:"token,key" help:"Who may visit: token (anyone with the URL, which carries a token) or key (callers with an API key of your organization)."`
	TTL  string `name:"ttl" default:"" help:"How long the preview works, as 90m or 24h (default 24h)."`
}

// Run makes the preview and prints its URL (the whole preview with -o json).
func (c *SandboxPreviewCmd) Run(ctx context.Context, stdout io.Writer) error {
	p, err := c.api().CreatePreview(ctx, c.ID, api.CreatePreviewRequest{Port: c.Port, Auth: c.Auth, TTL: c.TTL})
	if err != nil {
		return err
	}
	return c.print(stdout, p, func(tw *tabwriter.Writer) { fmt.Fprintln(tw, p.URL) })
}

// SandboxPreviewsCmd lists a sandbox's live previews.
type SandboxPreviewsCmd struct{ sandboxArg }

// Run lists them.
func (c *SandboxPreviewsCmd) Run(ctx context.Context, stdout io.Writer) error {
	ps, err := c.api().Previews(ctx, c.ID)
	if err != nil {
		return err
	}
	return c.print(stdout, api.PreviewList{Items: ps}, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "ID\tPORT\tAUTH\tEXPIRES\tURL")
		for _, p := range ps {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", p.ID, p.Port, p.Auth, p.ExpiresAt.Local().Format(time.DateTime), p.URL)
		}
	})
}

// SandboxPreviewRevokeCmd revokes a preview.
type SandboxPreviewRevokeCmd struct {
	sandboxArg
	Preview string `arg:"" help:"Preview id (pv_...)."`
}

// Run revokes it.
func (c *SandboxPreviewRevokeCmd) Run(ctx context.Context) error {
	return c.api().RevokePreview(ctx, c.ID, c.Preview)
}
