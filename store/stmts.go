package store

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// stmts caches the read statements that every request and every decision of
// the mirror runs (a sandbox by id, a page of the list, a key by its hash),
// prepared once: SQLite's parser was about a tenth of serve's CPU while
// sandboxes were being created. Queries built from user input (a list
// filtered by labels) can take many shapes, so the cache holds at most
// maxStmts and past that queries run unprepared.
type stmts struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
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
	return errors.Join(errs...)
}
