package store

import (
	"context"
	"strings"
	"testing"
)

// SetPruneBatch makes PruneEvents delete n events per statement, so a test
// can cross batches without thousands of rows. Call it before the store is
// in use.
func (s *Store) SetPruneBatch(n int) { s.pruneBatch = n }

// ExecSQL runs one statement on the writer, for a test that writes a row
// as an older schema has it.
func (s *Store) ExecSQL(ctx context.Context, q string, args ...any) error {
	_, err := s.write.ExecContext(ctx, q, args...)
	return err
}

// JournalMode reports the journal mode the database is in.
func (s *Store) JournalMode(ctx context.Context) (string, error) {
	var mode string
	err := s.read.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
	return mode, err
}

// Migrations lists the applied migrations in order.
func (s *Store) Migrations(ctx context.Context) ([]string, error) {
	rows, err := s.read.QueryContext(ctx, "SELECT name FROM schema_migrations ORDER BY name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// Plans returns SQLite's query plans of the quota check and of the page
// query of ListSandboxes with o.
func (s *Store) Plans(ctx context.Context, o ListOptions) (quota, list string, err error) {
	plan := func(q string, args ...any) (string, error) {
		rows, err := s.read.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			return "", err
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				return "", err
			}
			out = append(out, detail)
		}
		return strings.Join(out, "\n"), rows.Err()
	}
	if quota, err = plan(quotaSQL, o.OrgID); err != nil {
		return "", "", err
	}
	q, args, err := listQuery(o)
	if err != nil {
		return "", "", err
	}
	list, err = plan(q, args...)
	return quota, list, err
}

// IdlePlan is SQLite's query plan of IdleSandboxes.
func (s *Store) IdlePlan(ctx context.Context) (string, error) {
	rows, err := s.read.QueryContext(ctx, "EXPLAIN QUERY PLAN "+idleSQL, 0, 1)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			return "", err
		}
		out = append(out, detail)
	}
	return strings.Join(out, "\n"), rows.Err()
}

// CachedStmts is the number of prepared statements the store holds.
func (s *Store) CachedStmts() int {
	s.stmts.mu.Lock()
	defer s.stmts.mu.Unlock()
	return len(s.stmts.m)
}

// PreparedWrites is how many of the hot write statements are prepared, and
// how many there are.
func (s *Store) PreparedWrites() (int, int) { return len(s.stmts.w), len(writeSQL) }

// HoldWriter holds the writer's one connection in a transaction until
// release, so that writes queue behind it.
func (s *Store) HoldWriter(t testing.TB) (release func()) {
	tx, err := s.write.Begin()
	if err != nil {
		t.Fatal(err)
	}
	return func() { tx.Rollback() }
}

// BatchWaiting is how many writes wait for their batch; Batches how many
// batches have run.
func (s *Store) BatchWaiting() int64 { return s.batch.waiting.Load() }
func (s *Store) Batches() int64      { return s.batch.batches.Load() }

// OrgCounts are an organization's live and running sandboxes as the triggers
// keep them, and as counting the rows gives (the predicates of quotas).
func (s *Store) OrgCounts(ctx context.Context, orgID string) (kept, counted [2]int, err error) {
	if err = s.read.QueryRowContext(ctx, `SELECT coalesce((SELECT live FROM org_counts WHERE org_id = ?), 0),
		coalesce((SELECT running FROM org_counts WHERE org_id = ?), 0)`, orgID, orgID).Scan(&kept[0], &kept[1]); err != nil {
		return
	}
	err = s.read.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM sandboxes WHERE org_id = ? AND state NOT IN `+terminalSQL+`),
		(SELECT count(*) FROM sandboxes WHERE org_id = ? AND desired_mode = 'running' AND mode_outside = 0
			AND state NOT IN `+terminalSQL+` AND state NOT IN ('exited', 'expired'))`, orgID, orgID).Scan(&counted[0], &counted[1])
	return
}

// DeleteRow deletes a sandbox's row, which hiloop itself never does.
func (s *Store) DeleteRow(ctx context.Context, id string) error {
	_, err := s.write.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	return err
}

// ExecRaw runs a statement on the writer, for tests that build records by
// hand.
func (s *Store) ExecRaw(ctx context.Context, q string, args ...any) error {
	_, err := s.write.ExecContext(ctx, q, args...)
	return err
}

// InBatch runs fn as a write of the group commit; exec runs a statement of
// it that writes.
func (s *Store) InBatch(ctx context.Context, fn func(exec func(q string, args ...any) error) error) error {
	return s.inBatch(ctx, func(ctx context.Context, tx *txn) error {
		return fn(func(q string, args ...any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		})
	})
}
