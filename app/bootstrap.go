package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/term"
)

// bootstrap creates the admin organization and its first key on first
// start. The key goes to the bootstrap key file, mode 0600, and to stdout
// only when stdout is a terminal: in a cluster stdout is the pod's log,
// which many can read. The log says where the file is, never the key.
func (a *App) bootstrap(ctx context.Context, stdout io.Writer) error {
	path := a.cfg.bootstrapKeyFile()
	// The file is made (0600, empty) before the key exists, so a directory
	// hiloop cannot write to fails the start before a key is issued that
	// nobody could read. It replaces path only once it holds the key.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".hiloop-admin-key-*")
	if err != nil {
		return fmt.Errorf("--bootstrap-key-file: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	org, secret, err := a.db.Bootstrap(ctx, a.cfg.AdminOrg)
	if err != nil || secret == "" {
		return err
	}
	if err := writeKeyFile(tmp, path, secret); err != nil {
		return fmt.Errorf("--bootstrap-key-file: the first key of %s was issued but not written (%w); issue another with `hiloop key create --db %s --org %s`", org.Name, err, a.cfg.DB, org.Name)
	}
	a.log.Info("created the admin organization and its first API key", "org", org.Name, "org_id", org.ID, "key_file", path)
	if isTerminal(stdout) {
		fmt.Fprintf(stdout, "Created organization %s (%s) and its first API key, also in %s. It is shown only this once:\n\n    HILOOP_TOKEN=%s\n\n", org.Name, org.ID, path, secret)
	}
	return nil
}

// writeKeyFile writes secret to tmp and moves tmp to path.
func writeKeyFile(tmp *os.File, path, secret string) error {
	if _, err := tmp.WriteString(secret + "\n"); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
