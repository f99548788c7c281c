package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// The idle side of the record: when each sandbox was last used through
// hiloop, and which running sandboxes have gone unused past their idle
// timeout. Control writes it coarsely (at the start and end of use, and at
// most every few seconds in between), never per packet.

// RecordActivity records a use of a sandbox: its idle clock restarts at at
// (a later start on record stands), and open says whether a session or
// channel is still open into it. It is control's bookkeeping after it
// checked the caller, never a caller's request.
func (s *Store) RecordActivity(ctx context.Context, id string, at time.Time, open bool) error {
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET last_activity_at = max(last_activity_at, ?), activity_open = ? WHERE id = ?`,
		ms(at), open, id)
	if err != nil {
		return fmt.Errorf("record activity: %w", err)
	}
	return nil
}

// idleSQL reads the running sandboxes whose idle clock passed their timeout,
// the longest idle first, through the index sandboxes_idle: its expression
// and condition are repeated here exactly, or SQLite does not use it.
const idleSQL = `SELECT ` + sandboxColumns + ` FROM sandboxes
	WHERE idle_timeout > 0 AND state = 'running' AND last_activity_at + idle_timeout * 1000 <= ?
	ORDER BY last_activity_at + idle_timeout * 1000 LIMIT ?`

// IdleSandboxes lists, across organizations, up to limit running sandboxes
// whose record says they went unused for their idle timeout by now. Control
// holds each to what it knows that the record does not yet (a session open
// now) before it stops any.
func (s *Store) IdleSandboxes(ctx context.Context, now time.Time, limit int) ([]Sandbox, error) {
	list, err := s.querySandboxes(ctx, idleSQL, ms(now), limit)
	if err != nil {
		return nil, fmt.Errorf("idle sandboxes: %w", err)
	}
	return list, nil
}

// ResumeActivity is run once as hiloop starts, before it admits anything:
// every sandbox that the previous process left with a session or channel
// open is taken to have been in use until at (the restart), since nothing
// says when that use ended. The clocks of all others stand as recorded. It
// reports how many sandboxes it resumed.
func (s *Store) ResumeActivity(ctx context.Context, at time.Time) (int64, error) {
	res, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET last_activity_at = max(last_activity_at, ?), activity_open = 0 WHERE activity_open = 1`, ms(at))
	if err != nil {
		return 0, fmt.Errorf("resume activity: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// SetOrgIdleTimeout sets the idle timeout an organization's sandboxes get
// when their create names none: nil takes the deployment's default, 0 turns
// idle stop off. Sandboxes that exist keep theirs.
func (s *Store) SetOrgIdleTimeout(ctx context.Context, orgID string, d *time.Duration) error {
	var v sql.NullInt64
	if d != nil {
		v = sql.NullInt64{Int64: int64(*d / time.Second), Valid: true}
	}
	res, err := s.write.ExecContext(ctx, `UPDATE orgs SET idle_timeout = ? WHERE id = ?`, v, orgID)
	if err != nil {
		return fmt.Errorf("set org idle timeout: %w", err)
	}
	return affected(res, "org")
}
