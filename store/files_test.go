package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hiloop/hiloop/store"
)

// TestFilesOwnerOnly: the record holds private keys, so its database, WAL
// and shared-memory files are 0600 when created, an older start's files
// that others could read are made 0600 on open, and a backup copy is 0600.
func TestFilesOwnerOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "h.db")
	files := []string{path, path + "-wal", path + "-shm"}
	check := func(when string, paths ...string) {
		t.Helper()
		for _, p := range paths {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %s is %#o, want 0600", when, filepath.Base(p), fi.Mode().Perm())
			}
		}
	}
	s, err := store.Open(ctx, store.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.HostKey(ctx); err != nil { // a write: the WAL holds it
		t.Fatal(err)
	}
	check("created", files...)
	backup := filepath.Join(dir, "backup.db")
	if err := s.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	check("backup", backup)

	// As an older hiloop left them, while it still runs.
	for _, p := range files {
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	again, err := store.Open(ctx, store.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	check("opened again", files...)
}
