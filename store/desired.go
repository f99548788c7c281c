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

// SetExpiry records a new expiry. It is refused (ErrConflict) for a sandbox
// that is terminal or being deleted.
func (s *Store) SetExpiry(ctx context.Context, orgID, id string, at time.Time, ttlSeconds int64) (Sandbox, error) {
	var sb Sandbox
	err := s.inTx(ctx, func(tx *txn) error {
		var err error
		if sb, err = sandboxInTx(ctx, tx, orgID, id); err != nil {
			return err
		}
		if sb.State.Terminal() || sb.DesiredMode == ModeDeleted || sb.State == StateExpired {
			return fmt.Errorf("sandbox is %s: %w", stateOrDeleting(sb), ErrConflict)
		}
		at = at.UTC().Truncate(time.Millisecond)
		sb.ExpiresAt, sb.Spec.TTLSeconds, sb.UpdatedAt = &at, ttlSeconds, s.now().UTC().Truncate(time.Millisecond)
		spec, err := json.Marshal(sb.Spec)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET expires_at = ?, spec = ?, updated_at = ? WHERE id = ?`, ms(at), string(spec), ms(sb.UpdatedAt), id)
		return err
	})
	if err != nil {
		return Sandbox{}, fmt.Errorf("set expiry: %w", err)
	}
	return sb, nil
}

// SetIdleTimeout changes a sandbox's idle timeout; 0 turns idle stop off.
// It is refused (ErrConflict) for a sandbox that is terminal or being
// deleted. The idle clock keeps running from its last start.
func (s *Store) SetIdleTimeout(ctx context.Context, orgID, id string, d time.Duration) (Sandbox, error) {
	var sb Sandbox
	err := s.inTx(ctx, func(tx *txn) error {
		var err error
		if sb, err = sandboxInTx(ctx, tx, orgID, id); err != nil {
			return err
		}
		if sb.State.Terminal() || sb.DesiredMode == ModeDeleted {
			return fmt.Errorf("sandbox is %s: %w", stateOrDeleting(sb), ErrConflict)
		}
		sb.IdleTimeout, sb.UpdatedAt = d.Truncate(time.Second), s.now().UTC().Truncate(time.Millisecond)
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET idle_timeout = ?, updated_at = ? WHERE id = ?`, int64(sb.IdleTimeout/time.Second), ms(sb.UpdatedAt), id)
		return err
	})
	if err != nil {
		return Sandbox{}, fmt.Errorf("set idle timeout: %w", err)
	}
	return sb, nil
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

// RestoreExpiry puts back the expiry a failed cluster write was meant to
// change.
func (s *Store) RestoreExpiry(ctx context.Context, before Sandbox) error {
	if before.ExpiresAt == nil {
		return s.ClearExpiry(ctx, before.ID)
	}
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET expires_at = ?, spec = json_set(spec, '$.ttl_seconds', ?), updated_at = ? WHERE id = ?`,
		ms(*before.ExpiresAt), before.Spec.TTLSeconds, ms(s.now()), before.ID)
	if err != nil {
		return fmt.Errorf("restore expiry: %w", err)
	}
	return nil
}

// ClearExpiry removes a sandbox's expiry (undoing a failed TTL change).
func (s *Store) ClearExpiry(ctx context.Context, id string) error {
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET expires_at = NULL, spec = json_remove(spec, '$.ttl_seconds'), updated_at = ? WHERE id = ?`, ms(s.now()), id)
	if err != nil {
		return fmt.Errorf("clear expiry: %w", err)
	}
	return nil
}
