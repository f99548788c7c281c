package store

import (
	"context"
	"fmt"
	"time"
)

// Event is one recorded state transition.
type Event struct {
	Seq    int64
	At     time.Time
	From   State
	To     State
	Reason string
}

// insertEventSQL records a transition; creates and observations run it
// prepared (see writeSQL).
const insertEventSQL = `INSERT INTO sandbox_events (sandbox_id, at, from_state, to_state, reason) VALUES (?, ?, ?, ?, ?)`

// insertEvent records a state transition. Every change of a sandbox's state
// is one; the transaction wakes those waiting for it once it commits.
func insertEvent(ctx context.Context, tx *txn, id string, at time.Time, from, to State, reason string) error {
	tx.transitions = append(tx.transitions, id)
	_, err := tx.ExecContext(ctx, insertEventSQL, id, ms(at), from, to, reason)
	return err
}

// defaultPruneBatch is how many events PruneEvents deletes per statement.
const defaultPruneBatch = 1000

// PruneEvents deletes state transitions recorded before the cutoff, a batch
// at a time (Store.pruneBatch) so no write waits long behind it, and says how
// many went. The sandbox rows keep their current state; only history goes.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		res, err := s.write.ExecContext(ctx, `DELETE FROM sandbox_events WHERE seq IN
			(SELECT seq FROM sandbox_events WHERE at < ? ORDER BY seq LIMIT ?)`, ms(before), s.pruneBatch)
		if err != nil {
			return total, fmt.Errorf("prune events: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(s.pruneBatch) {
			return total, nil
		}
	}
}

// Events returns one of an organization's sandboxes' state transitions in
// order.
func (s *Store) Events(ctx context.Context, orgID, id string) ([]Event, error) {
	if _, err := s.Sandbox(ctx, orgID, id); err != nil {
		return nil, err
	}
	rows, err := s.read.QueryContext(ctx, `SELECT seq, at, from_state, to_state, reason FROM sandbox_events WHERE sandbox_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.From, &e.To, &e.Reason); err != nil {
			return nil, err
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	return out, rows.Err()
}
