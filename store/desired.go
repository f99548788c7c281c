package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// The desired side of the record: what the API last asked of a sandbox (its
// mode, its expiry), and the undoing of such a change when the cluster write
// that was to carry it out failed.

// ModeChange is a desired-mode change and what the record held before it,
// so that a failed cluster write can be undone exactly.
type ModeChange struct {
	Before, After Sandbox
}

// SetDesiredMode records what the API asked for, whatever the record's
// desired mode already was: a sandbox stopped outside hiloop still has desired
// running, and starting it must still make the cluster run it. Asking a
// sandbox to run checks the running quota in the same transaction unless it
// already counts against it. A terminal sandbox can only be deleted
// (ErrConflict otherwise), and a sandbox being deleted cannot be changed.
// A stop records cause (who asked for it); a start clears it.
func (s *Store) SetDesiredMode(ctx context.Context, orgID, id string, mode Mode, cause StopCause) (ModeChange, error) {
	var ch ModeChange
	err := s.inTx(ctx, func(tx *txn) error {
		sb, err := sandboxInTx(ctx, tx, orgID, id)
		if err != nil {
			return err
		}
		ch.Before = sb
		switch {
		case mode == ModeDeleted:
		case sb.State.Terminal() || sb.DesiredMode == ModeDeleted:
			return fmt.Errorf("sandbox is %s: %w", stateOrDeleting(sb), ErrConflict)
		case mode == ModeRunning && (sb.DesiredMode != ModeRunning || sb.ModeOutside):
			if _, err := checkQuota(ctx, tx, orgID, false); err != nil {
				return err
			}
		}
		switch mode {
		case ModeStopped:
			sb.StopCause = cause
		case ModeRunning:
			sb.StopCause = ""
		}
		sb.DesiredMode, sb.ModeOutside, sb.UpdatedAt = mode, false, s.now().UTC().Truncate(time.Millisecond)
		ch.After = sb
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET desired_mode = ?, mode_outside = 0, stop_cause = ?, updated_at = ? WHERE id = ?`,
			mode, sb.StopCause, ms(sb.UpdatedAt), id)
		return err
	})
	if err != nil {
		return ModeChange{}, fmt.Errorf("set mode %s: %w", mode, err)
	}
	return ch, nil
}

func stateOrDeleting(sb Sandbox) string {
	if sb.DesiredMode == ModeDeleted && !sb.State.Terminal() {
		return "being deleted"
	}
	return string(sb.State)
}

// Lifetime is a change of a sandbox's expiry and idle timeout: a nil field
// stays as it is.
type Lifetime struct {
	// ExpiresAt is the new expiry, TTLSeconds the TTL it was computed from.
	ExpiresAt  *time.Time
	TTLSeconds int64
	// IdleTimeout is the new idle timeout; 0 turns idle stop off. The idle
	// clock keeps running from its last start.
	IdleTimeout *time.Duration
}

// LifetimeChange is a lifetime change and what the record held before it,
// so that a failed cluster write can be undone exactly.
type LifetimeChange struct {
	Before, After Sandbox
}

// SetLifetime records a lifetime change in one transaction: every field it
// sets, or none. It is refused (ErrConflict) for a sandbox that is terminal
// or being deleted, and a new expiry for one that expired.
func (s *Store) SetLifetime(ctx context.Context, orgID, id string, l Lifetime) (LifetimeChange, error) {
	var ch LifetimeChange
	err := s.inTx(ctx, func(tx *txn) error {
		sb, err := sandboxInTx(ctx, tx, orgID, id)
		if err != nil {
			return err
		}
		ch.Before = sb
		if sb.State.Terminal() || sb.DesiredMode == ModeDeleted || (l.ExpiresAt != nil && sb.State == StateExpired) {
			return fmt.Errorf("sandbox is %s: %w", stateOrDeleting(sb), ErrConflict)
		}
		if l.ExpiresAt != nil {
			at := l.ExpiresAt.UTC().Truncate(time.Millisecond)
			sb.ExpiresAt, sb.Spec.TTLSeconds = &at, l.TTLSeconds
		}
		if l.IdleTimeout != nil {
			sb.IdleTimeout = l.IdleTimeout.Truncate(time.Second)
		}
		sb.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
		spec, err := json.Marshal(sb.Spec)
		if err != nil {
			return err
		}
		ch.After = sb
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET expires_at = ?, spec = ?, idle_timeout = ?, updated_at = ? WHERE id = ?`,
			nullMS(sb.ExpiresAt), string(spec), int64(sb.IdleTimeout/time.Second), ms(sb.UpdatedAt), id)
		return err
	})
	if err != nil {
		return LifetimeChange{}, fmt.Errorf("set lifetime: %w", err)
	}
	return ch, nil
}

// RestoreMode puts back the desired mode (and the outside-mode mark and the
// stop cause) that a failed cluster write was meant to change. It checks
// nothing: it undoes, it does not ask.
func (s *Store) RestoreMode(ctx context.Context, before Sandbox) error {
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET desired_mode = ?, mode_outside = ?, stop_cause = ?, updated_at = ? WHERE id = ?`,
		before.DesiredMode, before.ModeOutside, before.StopCause, ms(s.now()), before.ID)
	if err != nil {
		return fmt.Errorf("restore desired mode: %w", err)
	}
	return nil
}

// RestoreLifetime puts back the expiry, TTL and idle timeout that a failed
// cluster write was meant to change, in one statement. It checks nothing:
// it undoes, it does not ask.
func (s *Store) RestoreLifetime(ctx context.Context, before Sandbox) error {
	ttl := any(nil)
	if before.ExpiresAt != nil {
		ttl = before.Spec.TTLSeconds
	}
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET expires_at = ?,
		spec = CASE WHEN ? IS NULL THEN json_remove(spec, '$.ttl_seconds') ELSE json_set(spec, '$.ttl_seconds', ?) END,
		idle_timeout = ?, updated_at = ? WHERE id = ?`,
		nullMS(before.ExpiresAt), ttl, ttl, int64(before.IdleTimeout/time.Second), ms(s.now()), before.ID)
	if err != nil {
		return fmt.Errorf("restore lifetime: %w", err)
	}
	return nil
}
