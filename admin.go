package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/store"
)

// Offline admin flags.
type offline struct {
	DB string `default:"hiloop.db" env:"HILOOP_DB" help:"Path of the SQLite product record."`
}

// withDB opens the database file for fn and closes it after.
func (o offline) withDB(ctx context.Context, fn func(ctx context.Context, db *store.Store) error) error {
	db, err := store.Open(ctx, store.Options{Path: o.DB})
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(ctx, db)
}

// withOrg is withDB with an organization looked up by id (org_...) or name.
func (o offline) withOrg(ctx context.Context, ref string, fn func(ctx context.Context, db *store.Store, org store.Org) error) error {
	return o.withDB(ctx, func(ctx context.Context, db *store.Store) error {
		org, err := db.LookupOrg(ctx, ref)
		if err != nil {
			return err
		}
		return fn(ctx, db, org)
	})
}

// OrgCmd groups the organization commands.
type OrgCmd struct {
	Create OrgCreateCmd `cmd:"" help:"Create an organization and its first API key."`
	List   OrgListCmd   `cmd:"" help:"List organizations."`
	Quota  OrgQuotaCmd  `cmd:"" help:"Set an organization's quotas."`
	Idle   OrgIdleCmd   `cmd:"" name:"idle-timeout" help:"Set the idle timeout an organization's sandboxes get when their create names none."`
}

// OrgCreateCmd creates an organization with a first key.
type OrgCreateCmd struct {
	offline
	Name         string `arg:"" help:"Organization name."`
	MaxSandboxes int    `default:"50" help:"Most sandboxes it may hold."`
	MaxRunning   int    `default:"20" help:"Most sandboxes it may run at once."`
}

// Run creates the organization.
func (c *OrgCreateCmd) Run(ctx context.Context, stdout io.Writer) error {
	if c.MaxSandboxes < 1 || c.MaxRunning < 1 {
		return usageError{errors.New("--max-sandboxes and --max-running: must be at least 1")}
	}
	return c.withDB(ctx, func(ctx context.Context, db *store.Store) error {
		org, err := db.CreateOrg(ctx, c.Name, c.MaxSandboxes, c.MaxRunning)
		if err != nil {
			return err
		}
		_, secret, err := db.CreateKey(ctx, org.ID, "first")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Created organization %s (%s). Its first API key, shown only this once:\n\n    HILOOP_TOKEN=%s\n", org.Name, org.ID, secret)
		return nil
	})
}

// OrgListCmd lists organizations.
type OrgListCmd struct{ offline }

// Run lists.
func (c *OrgListCmd) Run(ctx context.Context, stdout io.Writer) error {
	var orgs []store.Org
	err := c.withDB(ctx, func(ctx context.Context, db *store.Store) (err error) {
		orgs, err = db.Orgs(ctx)
		return err
	})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tMAX SANDBOXES\tMAX RUNNING\tIDLE TIMEOUT")
	for _, o := range orgs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", o.ID, o.Name, o.MaxSandboxes, o.MaxRunning, orgIdle(o.IdleTimeout))
	}
	return tw.Flush()
}

// OrgQuotaCmd sets quotas.
type OrgQuotaCmd struct {
	offline
	Org          string `arg:"" help:"Organization id or name."`
	MaxSandboxes int    `required:"" help:"Most sandboxes it may hold."`
	MaxRunning   int    `required:"" help:"Most sandboxes it may run at once."`
}

// Run sets the quotas.
func (c *OrgQuotaCmd) Run(ctx context.Context, stdout io.Writer) error {
	if c.MaxSandboxes < 0 || c.MaxRunning < 0 {
		return usageError{errors.New("--max-sandboxes and --max-running: must not be negative")}
	}
	return c.withOrg(ctx, c.Org, func(ctx context.Context, db *store.Store, org store.Org) error {
		if err := db.SetQuota(ctx, org.ID, c.MaxSandboxes, c.MaxRunning); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: max %d sandboxes, %d running\n", org.Name, c.MaxSandboxes, c.MaxRunning)
		return nil
	})
}

// OrgIdleCmd sets an organization's default idle timeout.
type OrgIdleCmd struct {
	offline
	Org         string `arg:"" help:"Organization id or name."`
	IdleTimeout string `arg:"" name:"duration" help:"Idle timeout of its sandboxes created without one, such as 30m; 0 turns idle stop off for them; default takes the deployment's (serve --default-idle-timeout)."`
}

// Run sets it. Sandboxes that exist keep theirs.
func (c *OrgIdleCmd) Run(ctx context.Context, stdout io.Writer) error {
	var d *time.Duration
	if c.IdleTimeout != "default" {
		v, err := time.ParseDuration(c.IdleTimeout)
		if err != nil || control.CheckIdleTimeout(v) != nil {
			return usageError{fmt.Errorf("duration: %q is not 0, default, or a duration from %s to %s", c.IdleTimeout, control.MinIdleTimeout, control.MaxTTL)}
		}
		d = &v
	}
	return c.withOrg(ctx, c.Org, func(ctx context.Context, db *store.Store, org store.Org) error {
		if err := db.SetOrgIdleTimeout(ctx, org.ID, d); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: idle timeout of new sandboxes %s\n", org.Name, orgIdle(d))
		return nil
	})
}

// orgIdle is an organization's idle timeout as the admin commands print it.
func orgIdle(d *time.Duration) string {
	switch {
	case d == nil:
		return "default"
	case *d == 0:
		return "off"
	}
	return d.String()
}

// KeyCmd groups the key commands.
type KeyCmd struct {
	Create KeyCreateCmd `cmd:"" help:"Issue an API key."`
	List   KeyListCmd   `cmd:"" help:"List API keys."`
	Revoke KeyRevokeCmd `cmd:"" help:"Revoke an API key."`
}

// keyTarget says where a key command acts: the database file for --org
// (offline admin), else the API for the caller's own organization.
type keyTarget struct {
	Client `embed:""`
	offline
	Org string `help:"Organization id or name: act on the database file offline instead of through the API."`
}

// KeyCreateCmd issues a key.
type KeyCreateCmd struct {
	keyTarget
	Name string `default:"" help:"A name to remember the key by."`
}

// Run issues the key.
func (c *KeyCreateCmd) Run(ctx context.Context, stdout io.Writer) error {
	var k api.CreatedKey
	var err error
	if c.Org != "" {
		err = c.withOrg(ctx, c.Org, func(ctx context.Context, db *store.Store, org store.Org) (err error) {
			var sk store.APIKey
			sk, k.Secret, err = db.CreateKey(ctx, org.ID, c.Name)
			k.APIKey = sk.API()
			return err
		})
	} else {
		k, err = c.api().CreateKey(ctx, c.Name)
	}
	if err != nil {
		return err
	}
	return c.print(stdout, k, func(tw *tabwriter.Writer) {
		fmt.Fprintf(tw, "Key %s for %s, shown only this once:\n\n    HILOOP_TOKEN=%s\n", k.ID, k.OrgID, k.Secret)
	})
}

// KeyListCmd lists keys.
type KeyListCmd struct{ keyTarget }

// Run lists the keys.
func (c *KeyListCmd) Run(ctx context.Context, stdout io.Writer) error {
	var keys []api.APIKey
	var err error
	if c.Org != "" {
		err = c.withOrg(ctx, c.Org, func(ctx context.Context, db *store.Store, org store.Org) error {
			sk, err := db.Keys(ctx, org.ID)
			keys = store.APIList[store.APIKey, api.APIKey](sk)
			return err
		})
	} else {
		keys, err = c.api().Keys(ctx)
	}
	if err != nil {
		return err
	}
	return c.print(stdout, keys, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "ID\tNAME\tCREATED\tREVOKED")
		for _, k := range keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.Local().Format(time.DateTime)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Local().Format(time.DateTime), revoked)
		}
	})
}

// KeyRevokeCmd revokes a key.
type KeyRevokeCmd struct {
	keyTarget
	ID    string `arg:"" help:"Key id."`
	Force bool   `help:"With --org: revoke even the organization's last live key, locking it out until a new key is created offline."`
}

// Run revokes. Through the API the organization's last live key cannot be
// revoked; offline, --force allows it.
func (c *KeyRevokeCmd) Run(ctx context.Context, stdout io.Writer) error {
	if c.Force && c.Org == "" {
		return usageError{errors.New("--force: only with --org (offline)")}
	}
	var err error
	if c.Org != "" {
		err = c.withOrg(ctx, c.Org, func(ctx context.Context, db *store.Store, org store.Org) error {
			return db.RevokeKey(ctx, org.ID, c.ID, c.Force)
		})
		if errors.Is(err, store.ErrLastKey) {
			err = fmt.Errorf("%s is %w; create another key first, or pass --force", c.ID, err)
		}
	} else {
		err = c.api().RevokeKey(ctx, c.ID)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s\n", c.ID)
	return nil
}

// BackupCmd copies the record online.
type BackupCmd struct {
	offline
	Out string `arg:"" help:"File to write; it must not exist. - writes the backup to stdout (through a temporary file, checked first), for kubectl exec into an image without tar."`
}

// Run takes the backup while serve may be running and checks it.
func (c *BackupCmd) Run(ctx context.Context, stdout io.Writer) error {
	return c.withDB(ctx, func(ctx context.Context, db *store.Store) error {
		start := time.Now()
		out, report := c.Out, stdout
		if c.Out == "-" {
			dir, err := os.MkdirTemp("", "hiloop-backup-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			out, report = filepath.Join(dir, "backup.db"), os.Stderr
		}
		if err := db.Backup(ctx, out); err != nil {
			return err
		}
		fi, err := os.Stat(out)
		if err != nil {
			return err
		}
		if c.Out == "-" {
			f, err := os.Open(out)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(stdout, f); err != nil {
				return fmt.Errorf("write the backup to stdout: %w", err)
			}
		}
		fmt.Fprintf(report, "backed up %s to %s (%d bytes, integrity ok) in %s\n", c.DB, c.Out, fi.Size(), time.Since(start).Round(time.Millisecond))
		return nil
	})
}
