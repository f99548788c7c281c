package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
)

// TestIsUnique: isUnique goes by the driver's error code, not its text. A
// duplicate of a UNIQUE column, of a primary key or of a rowid is one; the
// other constraints are not, nor an error that only says the words.
func TestIsUnique(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", dsn(filepath.Join(t.TempDir(), "u.db"), true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	exec := func(q string, args ...any) error {
		_, err := db.ExecContext(ctx, q, args...)
		return err
	}
	if err := exec(`CREATE TABLE t (id TEXT PRIMARY KEY, name TEXT UNIQUE, n INTEGER NOT NULL CHECK (n > 0),
		parent TEXT REFERENCES t (id))`); err != nil {
		t.Fatal(err)
	}
	if err := exec(`INSERT INTO t (rowid, id, name, n) VALUES (1, 'a', 'alpha', 1)`); err != nil {
		t.Fatal(err)
	}
	duplicateName := exec(`INSERT INTO t (id, name, n) VALUES ('b', 'alpha', 1)`)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"unique column", duplicateName, true},
		{"wrapped", fmt.Errorf("create: %w", duplicateName), true},
		{"primary key", exec(`INSERT INTO t (id, name, n) VALUES ('a', 'beta', 1)`), true},
		{"rowid", exec(`INSERT INTO t (rowid, id, name, n) VALUES (1, 'c', 'gamma', 1)`), true},
		{"not null", exec(`INSERT INTO t (id, name, n) VALUES ('d', 'delta', NULL)`), false},
		{"check", exec(`INSERT INTO t (id, name, n) VALUES ('e', 'epsilon', 0)`), false},
		{"foreign key", exec(`INSERT INTO t (id, name, n, parent) VALUES ('f', 'phi', 1, 'nobody')`), false},
		{"only the words", errors.New("UNIQUE constraint failed: t.name"), false},
	} {
		if tc.err == nil {
			t.Fatalf("%s: the statement did not fail", tc.name)
		}
		if got := isUnique(tc.err); got != tc.want {
			t.Errorf("%s: isUnique(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if isUnique(nil) {
		t.Error("isUnique(nil) = true")
	}
}
