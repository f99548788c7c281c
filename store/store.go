// Package store is hiloop's product record: an embedded SQLite database,
// opened on purpose (WAL, busy timeout, foreign keys) and migrated from the
// numbered SQL files of package migrations.
//
// Reads go through a pool of connections; every write goes through a single
// connection whose transactions begin IMMEDIATE, so that read-check-write
// sequences such as quota checks are serialised by the database itself.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/hiloop/hiloop/migrations"
)

// Sentinel errors. Callers compare with errors.Is; the server maps them to
// HTTP status codes in one place.
var (
	// ErrNotFound reports that the record does not exist, or is not visible to
	// the organization that asked.
	ErrNotFound = errors.New("not found")
	// ErrConflict reports that the write contradicts what the record holds
	// (a duplicate name, a reused idempotency key with another body, ...).
	ErrConflict = errors.New("conflict")
	// ErrQuota reports that the write would exceed an organization's quota.
	ErrQuota = errors.New("quota exceeded")
)

// Store is an open product record.
type Store struct {
	read  *sql.DB
	write *sql.DB
	now   func() time.Time
	stmts stmts
	// changes wakes those waiting for a state change (StateChange).
	changes changes
	// batch is the group commit of creates and observations (inBatch).
	batch batcher
	// pruneBatch is how many events PruneEvents deletes per statement:
	// defaultPruneBatch, which tests lower to cross batches with few rows.
	pruneBatch int
}

// Options configure Open.
type Options struct {
	// Path is the database file. It is created if missing.
	Path string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Migrations overrides the embedded migrations (tests use it to build a
	// database of an older schema).
	Migrations fs.FS
}

// readConns is how many connections read at once.
const readConns = 8

// Open opens (creating if needed) and migrates the database at opts.Path.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Path == "" {
		return nil, errors.New("open store: empty path")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Migrations == nil {
		opts.Migrations = migrations.FS
	}
	if err := ownerOnly(opts.Path); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	read, err := sql.Open("sqlite", dsn(opts.Path, false))
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	write, err := sql.Open("sqlite", dsn(opts.Path, true))
	if err != nil {
		read.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	// database/sql keeps two idle connections unless told otherwise: under
	// a burst the other readers would close after each query and reopen,
	// with the files, the pragmas and the schema parse each time.
	write.SetMaxOpenConns(1)
	read.SetMaxOpenConns(readConns)
	read.SetMaxIdleConns(readConns)
	s := &Store{read: read, write: write, now: opts.Now, pruneBatch: defaultPruneBatch}
	if err := s.check(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("open store %s: %w", opts.Path, err)
	}
	if err := migrate(ctx, write, opts.Migrations, opts.Now); err != nil {
		s.Close()
		return nil, fmt.Errorf("migrate store %s: %w", opts.Path, err)
	}
	s.prepareWrites(ctx)
	s.startBatches()
	return s, nil
}

// ownerOnly makes the database file mode 0600 before SQLite opens it: it
// holds the SSH gateway's host key and its key for session helpers. SQLite
// creates a missing database file 0644 whatever the umask (it chmods a file
// it created to that), and its -wal and -shm files with the database file's
// mode. So the file is created here, 0600, and a database file, WAL or
// shared-memory file of an older start that others may read loses those
// permissions.
func ownerOnly(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			if err := os.Chmod(p, perm&0o700); err != nil {
				return fmt.Errorf("%s is mode %#o, readable by others, and could not be made owner-only: %w", p, perm, err)
			}
		}
	}
	return nil
}

// dsn returns a modernc DSN that sets the pragmas on every pooled connection.
// synchronous=NORMAL is the decision: in WAL mode it never corrupts the
// database, and a power loss can only drop the last transactions.
func dsn(p string, writer bool) string {
	q := url.Values{}
	for _, pragma := range []string{"journal_mode(WAL)", "busy_timeout(10000)", "foreign_keys(1)", "synchronous(NORMAL)"} {
		q.Add("_pragma", pragma)
	}
	if writer {
		q.Set("_txlock", "immediate")
	}
	return "file:" + p + "?" + q.Encode()
}

// check verifies that the pragmas actually took: WAL can silently fall back
// (for example on a file system without shared memory).
func (s *Store) check(ctx context.Context) error {
	var mode string
	if err := s.write.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal_mode is %q, want wal", mode)
	}
	var fk int
	if err := s.read.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil {
		return err
	}
	if fk != 1 {
		return errors.New("foreign keys are off")
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.stopBatches()
	return errors.Join(s.stmts.close(), s.read.Close(), s.write.Close())
}

// migrate applies, in name order, every NNNN_*.sql file of fsys that the
// schema_migrations table does not yet record, each in its own transaction.
func migrate(ctx context.Context, db *sql.DB, fsys fs.FS, now func() time.Time) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return err
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := applyMigration(ctx, db, fsys, name, now); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func applyMigration(ctx context.Context, db *sql.DB, fsys fs.FS, name string, now func() time.Time) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM schema_migrations WHERE name = ?", name).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	body, err := fs.ReadFile(fsys, path.Clean(name))
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, string(body)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)", name, now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit()
}

// inTx runs fn in one write transaction, committed when fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx *txn) error) error {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	t := &txn{Tx: tx, prepared: s.stmts.w}
	if err := fn(t); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for _, id := range t.transitions {
		s.changes.stateChanged(id)
	}
	return nil
}

// NewID returns a random opaque id with the given prefix, such as "sbx".
// The random part is lower-case base32, so it is also valid in a Kubernetes
// name and label value.
func NewID(prefix string) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, 16)
	rand.Read(b)
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = alphabet[int(c)%len(alphabet)]
	}
	return prefix + "_" + string(out)
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

func nullMS(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

func fromNullMS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMS(v.Int64)
	return &t
}

// isUnique reports whether err is a SQLite UNIQUE constraint failure: of a
// UNIQUE column or index, or of a primary key (SQLite reports a rowid's as
// its own code). The driver turns on extended result codes, which tell these
// apart from the other constraints (NOT NULL, CHECK, FOREIGN KEY).
func isUnique(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_ROWID:
		return true
	}
	return false
}

// Backup writes a consistent copy of the record to out, which must not
// exist, while the record stays in use: SQLite's VACUUM INTO reads one
// snapshot (WAL readers do not block writers, nor writers them). The copy is
// then opened and checked with PRAGMA integrity_check. A copy that fails
// the check is removed.
func (s *Store) Backup(ctx context.Context, out string) error {
	// The copy holds the same keys as the record: it is created here, empty
	// and 0600, which VACUUM INTO accepts and keeps, instead of by SQLite,
	// 0644.
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("backup: %s exists; backups never overwrite", out)
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	f.Close()
	if _, err := s.read.ExecContext(ctx, `VACUUM INTO ?`, out); err != nil {
		os.Remove(out)
		return fmt.Errorf("backup: %w", err)
	}
	if err := CheckIntegrity(ctx, out); err != nil {
		os.Remove(out)
		return err
	}
	return nil
}

// CheckIntegrity opens a database file read-only and runs PRAGMA
// integrity_check on it.
func CheckIntegrity(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return fmt.Errorf("integrity check: %w", err)
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&res); err != nil {
		return fmt.Errorf("integrity check of %s: %w", path, err)
	}
	if res != "ok" {
		return fmt.Errorf("integrity check of %s: %s", path, res)
	}
	return nil
}

// ErrUnavailable reports that the database file cannot be written now (it
// is read-only, the disk is full, an I/O error, a lock held too long):
// storage trouble, not a bug, and the write may succeed later.
var ErrUnavailable = errors.New("storage unavailable")

// Unavailable reports whether err is storage trouble: ErrUnavailable, or an
// SQLite error whose primary code says the file could not be written or
// read.
func Unavailable(err error) bool {
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
		sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
		return true
	}
	return false
}

// Probe makes one small write, so readiness reflects whether the record
// can be written now.
func (s *Store) Probe(ctx context.Context) error {
	_, err := s.write.ExecContext(ctx, `INSERT OR REPLACE INTO settings (key, value) VALUES ('probe', ?)`, s.now().UTC().Format(time.RFC3339Nano))
	if err != nil {
		return fmt.Errorf("storage probe: %w", err)
	}
	return nil
}

// SetReadOnly makes the writer connection refuse writes (SQLite's
// query_only), or lifts that. Fault-injection tests use it to stand in for
// a file system that refuses writes, which root cannot be made to see. It is
// exported, not in export_test.go, because those tests are the server's:
// they check that storage trouble answers 503, never 500, and turns
// readiness red.
func (s *Store) SetReadOnly(ctx context.Context, on bool) error {
	v := 0
	if on {
		v = 1
	}
	_, err := s.write.ExecContext(ctx, fmt.Sprintf(`PRAGMA query_only = %d`, v))
	return err
}
