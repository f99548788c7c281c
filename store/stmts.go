package store

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// stmts caches the read statements that every request and every decision of
// the mirror runs (a sandbox by id, a page of the list, a key by its hash),
// prepared once, so SQLite parses each once and not on every call
// (docs/benchmarks.md has what that saves). Queries built from user input
// (a list filtered by labels) can take many shapes, so the cache holds at
// most maxStmts and past that queries run unprepared.
type stmts struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// w holds writeSQL prepared on the writer; it is filled at Open and
	// only read after.
	w map[string]*sql.Stmt
}

// writeSQL are the statements of the write transactions every create and
// every observation runs, prepared once, at Open, on the writer's one
// connection: a statement cannot be prepared on the writer while a
// transaction holds its connection. txn runs them through tx.StmtContext,
// which reuses the connection's prepared statement.
var writeSQL = []string{anySandboxSQL, orgSandboxSQL, quotaSQL, insertSandboxSQL, observeSQL, insertEventSQL,
	savepointSQL, rollbackToSQL, releaseSQL}

// prepareWrites prepares writeSQL on the writer. A statement that does not
// prepare (a test's schema without its table) runs unprepared, and fails
// then with its error.
func (s *Store) prepareWrites(ctx context.Context) {
	s.stmts.w = map[string]*sql.Stmt{}
	for _, q := range writeSQL {
		if st, err := s.write.PrepareContext(ctx, q); err == nil {
			s.stmts.w[q] = st
		}
	}
}

// txn is a write transaction whose statements of writeSQL run prepared.
type txn struct {
	*sql.Tx
	prepared map[string]*sql.Stmt
	// transitions are the sandboxes whose state it changed (insertEvent),
	// woken once it commits.
	transitions []string
	// savepoint is set while a write of a batch runs: its first statement
	// that writes opens the write's savepoint, and opened says it did. A
	// write that only reads (the mirror's decision that nothing changed)
	// then costs no savepoint (see commitBatch).
	savepoint, opened bool
}

func (t *txn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if st := t.prepared[q]; st != nil {
		return t.Tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, q, args...)
}

func (t *txn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if t.savepoint && !t.opened {
		if _, err := t.exec(ctx, savepointSQL); err != nil {
			return nil, err
		}
		t.opened = true
	}
	return t.exec(ctx, q, args...)
}

func (t *txn) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := t.prepared[q]; st != nil {
		return t.Tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, q, args...)
}

const maxStmts = 64

// queryRow runs a read query that returns one row, through the cache.
func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st := s.readStmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return s.read.QueryRowContext(ctx, q, args...)
}

// query runs a read query, through the cache.
func (s *Store) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := s.readStmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return s.read.QueryContext(ctx, q, args...)
}

// readStmt is q prepared on the read pool, or nil when the cache is full or
// q does not prepare (the caller then runs it unprepared and gets its error).
func (s *Store) readStmt(ctx context.Context, q string) *sql.Stmt {
	s.stmts.mu.Lock()
	st, ok := s.stmts.m[q]
	full := len(s.stmts.m) >= maxStmts
	s.stmts.mu.Unlock()
	if ok || full {
		return st
	}
	st, err := s.read.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	s.stmts.mu.Lock()
	defer s.stmts.mu.Unlock()
	if have, ok := s.stmts.m[q]; ok {
		st.Close()
		return have
	}
	if s.stmts.m == nil {
		s.stmts.m = map[string]*sql.Stmt{}
	}
	if len(s.stmts.m) >= maxStmts {
		st.Close()
		return nil
	}
	s.stmts.m[q] = st
	return st
}

// close closes every cached statement.
func (c *stmts) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for q, st := range c.m {
		errs = append(errs, st.Close())
		delete(c.m, q)
	}
	// Transactions read w without the lock (it is filled once, at Open),
	// and one may still run as the store closes: its statements are closed,
	// which such a transaction is told, and the map is left as it is.
	for _, st := range c.w {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}
