package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hiloop/hiloop/receipt"
)

// The observed side of the record: the sandboxes the status mirror must
// reconcile and what it concluded of them from the cluster, the failure of a
// create that never reached the cluster, what the SSH gateway saw of a
// pod's session helper, and what a runtime attestation saw inside a pod.

// Observation is what the mirror concluded from the cluster.
type Observation struct {
	State    State
	Anomaly  string
	ExitCode *int
	Reason   string
	// PodUID is the live pod observed, "" when there is none.
	PodUID string
}

// observeSQL is an observation's write, run prepared (see writeSQL).
const observeSQL = `UPDATE sandboxes SET state = ?, anomaly = ?, exit_code = ?, reason = ?, pod_uid = ?, mode_outside = ?,
	last_activity_at = ?, updated_at = ? WHERE id = ?`

// Unsettled lists, across organizations, every sandbox that still has (or
// should have) a cluster object: the ones the mirror must reconcile.
func (s *Store) Unsettled(ctx context.Context) ([]Sandbox, error) {
	return s.querySandboxes(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE state NOT IN `+terminalSQL+` ORDER BY rowid`)
}

// outside reports whether the observation means the sandbox's mode was
// changed outside hiloop: stopped or stopping while it should run.
func (o Observation) outside(sb Sandbox) bool {
	return sb.DesiredMode == ModeRunning && (o.State == StateStopped || o.State == StateStopping)
}

// Unchanged reports whether recording the observation would change nothing
// in the record: it equals what the record holds, or the record is terminal
// (a terminal state is final: nothing observed later can revive it).
func (o Observation) Unchanged(sb Sandbox) bool {
	return sb.State.Terminal() || (sb.State == o.State && sb.Anomaly == o.Anomaly && sb.Reason == o.Reason &&
		equalCode(sb.ExitCode, o.ExitCode) && sb.PodUID == o.PodUID && sb.ModeOutside == o.outside(sb))
}

// Observe records what the mirror observed. It writes nothing when the
// observation equals the record, and records an event when the state changes.
// It reports whether it wrote. Observing a sandbox stopped or stopping while
// its desired mode is running marks its mode as changed outside hiloop. An
// observation that the sandbox stopped, or runs another pod, ends its
// running processes in the same write (endProcesses).
//
// The mirror decides inside the write (ObserveWith). Observe, the same write
// of an observation made beforehand, is exported for the tests of the
// packages above the store (control, server): they stand in for the mirror
// to put a record in a state without a cluster, which export_test.go cannot
// serve them.
func (s *Store) Observe(ctx context.Context, id string, o Observation) (bool, error) {
	return s.ObserveWith(ctx, id, func(Sandbox) (Observation, error) { return o, nil })
}

// ObserveWith is Observe of the observation that decide makes of the record
// as it stands in the write transaction. The mirror decides there: its
// decision and its write see one record, and a cluster event that changes
// nothing costs a statement in a shared transaction (see inBatch) rather
// than a read transaction of its own. decide runs on the store's writer, so
// it must be quick and must not call the store.
func (s *Store) ObserveWith(ctx context.Context, id string, decide func(Sandbox) (Observation, error)) (bool, error) {
	changed := false
	err := s.inBatch(ctx, func(ctx context.Context, tx *txn) error {
		sb, err := anySandboxInTx(ctx, tx, id)
		if err != nil {
			return err
		}
		if sb.State.Terminal() {
			return nil
		}
		o, err := decide(sb)
		if err != nil || o.Unchanged(sb) {
			return err
		}
		outside := o.outside(sb)
		now := s.now().UTC().Truncate(time.Millisecond)
		var exit sql.NullInt64
		if o.ExitCode != nil {
			exit = sql.NullInt64{Int64: int64(*o.ExitCode), Valid: true}
		}
		// The idle clock runs only while the sandbox runs: it starts
		// again when the sandbox comes up.
		active := sb.LastActivityAt
		if o.State == StateRunning && sb.State != StateRunning && now.After(active) {
			active = now
		}
		if _, err := tx.ExecContext(ctx, observeSQL,
			o.State, o.Anomaly, exit, o.Reason, o.PodUID, outside, ms(active), ms(now), id); err != nil {
			return err
		}
		changed = true
		if err := endProcesses(ctx, tx, id, o, now); err != nil {
			return err
		}
		if sb.State == o.State {
			return nil
		}
		reason := o.Reason
		if o.Anomaly != "" {
			reason = strings.TrimSuffix(o.Anomaly+": "+o.Reason, ": ")
		}
		return insertEvent(ctx, tx, id, now, sb.State, o.State, reason)
	})
	if err != nil {
		return false, fmt.Errorf("observe: %w", err)
	}
	return changed, nil
}

// ErrStalePod answers PinHelperKey for a pod that is not the record's
// pod (any more, or yet).
var ErrStalePod = errors.New("the pod is not the sandbox's observed pod")

// PinHelperKey holds the session helper of sandbox id's pod podUID to the
// first host key it showed (fingerprint fp): with no pin for that pod yet
// (none, or the last pod's), fp becomes it. It returns the fingerprint
// pinned for the pod. When that is not fp, the helper changed its key
// within the pod's life: the first time, that is recorded
// (helper_key_changed_pod), which the mirror turns into an attention
// anomaly; later times write nothing. Only the record's observed pod is
// pinned: for any other, which a dial that read the record before the pod
// was replaced may still name, it writes nothing and returns ErrStalePod.
func (s *Store) PinHelperKey(ctx context.Context, id, podUID, fp string) (string, error) {
	var pinned string
	err := s.inBatch(ctx, func(ctx context.Context, tx *txn) error {
		var current, pod, key, changed string
		err := tx.QueryRowContext(ctx, `SELECT pod_uid, helper_pin_pod, helper_pin_key, helper_key_changed_pod FROM sandboxes WHERE id = ?`, id).
			Scan(&current, &pod, &key, &changed)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return ErrNotFound
		case err != nil:
			return err
		case podUID == "" || podUID != current:
			return ErrStalePod
		case pod != podUID:
			key = fp
			_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET helper_pin_pod = ?, helper_pin_key = ? WHERE id = ?`, podUID, fp, id)
		case key != fp && changed != podUID:
			_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET helper_key_changed_pod = ? WHERE id = ?`, podUID, id)
		}
		pinned = key
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pin helper key: %w", err)
	}
	return pinned, nil
}

// RecordRuntime records what a runtime attestation of sandbox id's pod
// podUID saw: the runtime and the kernel release (capped at
// receipt.MaxKernelRelease). Each pod is recorded once: a second record of
// the same pod writes nothing. Only the record's observed pod is recorded:
// for any other (a pod replaced while it was probed) it writes nothing and
// returns ErrStalePod. It reports whether it wrote.
func (s *Store) RecordRuntime(ctx context.Context, id, podUID string, seen receipt.Runtime, release string) (bool, error) {
	if !seen.Known() {
		return false, fmt.Errorf("record runtime: unknown observation %q", seen)
	}
	release = release[:min(len(release), receipt.MaxKernelRelease)]
	wrote := false
	err := s.inBatch(ctx, func(ctx context.Context, tx *txn) error {
		var current, attested string
		err := tx.QueryRowContext(ctx, `SELECT pod_uid, runtime_pod FROM sandboxes WHERE id = ?`, id).Scan(&current, &attested)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return ErrNotFound
		case err != nil:
			return err
		case podUID == "" || podUID != current:
			return ErrStalePod
		case attested == podUID:
			return nil
		}
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET runtime_pod = ?, runtime_observed = ?, runtime_release = ? WHERE id = ?`,
			podUID, seen, release, id)
		wrote = err == nil
		return err
	})
	if err != nil {
		return false, fmt.Errorf("record runtime: %w", err)
	}
	return wrote, nil
}

// Fail records that a sandbox's create definitely did not reach the cluster
// (the cluster refused it, or it never got it), with a reason fit to show
// its owner. It changes nothing once the record is terminal or observed.
func (s *Store) Fail(ctx context.Context, id, reason string) error {
	err := s.inTx(ctx, func(tx *txn) error {
		sb, err := anySandboxInTx(ctx, tx, id)
		if err != nil || sb.State != StatePending {
			return err
		}
		now := s.now().UTC().Truncate(time.Millisecond)
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ?, updated_at = ? WHERE id = ?`, StateFailed, reason, ms(now), id); err != nil {
			return err
		}
		return insertEvent(ctx, tx, id, now, sb.State, StateFailed, reason)
	})
	if err != nil {
		return fmt.Errorf("fail sandbox: %w", err)
	}
	return nil
}

func equalCode(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
