package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The processes of a sandbox: commands started detached in it. The record
// holds what a caller may ask of them when the sandbox cannot answer: that
// one is running, how it exited, or why it ended without an exit status
// hiloop saw. A process lives no longer than the pod it was started in, so
// an observation that the sandbox stopped or its pod was replaced ends its
// running processes in the same write (endProcesses): nobody is told
// "running" of a process whose pod is gone.

// ProcessState is what the record knows of a process.
type ProcessState string

// Process states.
const (
	ProcessRunning ProcessState = "running"
	ProcessExited  ProcessState = "exited"
	ProcessEnded   ProcessState = "ended"
)

// EndReason says why a process ended without an exit status.
type EndReason string

// End reasons.
const (
	EndSandboxStopped EndReason = "sandbox_stopped"
	EndPodReplaced    EndReason = "pod_replaced"
	EndStateLost      EndReason = "state_lost"
	EndStartFailed    EndReason = "start_failed"
)

// ErrProcessLimit: the sandbox has as many running processes as it may.
var ErrProcessLimit = errors.New("process limit reached")

// Process is one process's record.
type Process struct {
	ID        string
	SandboxID string
	Command   []string
	State     ProcessState
	// ExitCode is set once the process exited.
	ExitCode *int
	// Reason is set once the process ended.
	Reason EndReason
	// PodUID is the pod the process was started in.
	PodUID    string
	StartedAt time.Time
	EndedAt   *time.Time
}

const processColumns = `p.id, p.sandbox_id, p.command, p.state, p.exit_code, p.end_reason, p.pod_uid, p.started_at, p.ended_at`

func scanProcess(row interface{ Scan(...any) error }) (Process, error) {
	var p Process
	var cmd string
	var code, ended sql.NullInt64
	var started int64
	if err := row.Scan(&p.ID, &p.SandboxID, &cmd, &p.State, &code, &p.Reason, &p.PodUID, &started, &ended); err != nil {
		return Process{}, err
	}
	if err := json.Unmarshal([]byte(cmd), &p.Command); err != nil {
		return Process{}, fmt.Errorf("process %s: command: %w", p.ID, err)
	}
	if code.Valid {
		c := int(code.Int64)
		p.ExitCode = &c
	}
	p.StartedAt, p.EndedAt = fromMS(started), fromNullMS(ended)
	return p, nil
}

// ProcessLimits bound the processes of one sandbox in the record.
type ProcessLimits struct {
	// Running is the most running processes; a start past it is
	// ErrProcessLimit.
	Running int
	// Finished is how many exited or ended processes are kept; a start
	// forgets the oldest past it.
	Finished int
}

// StartProcess records process p, running, in one of the organization's
// sandboxes, in the pod the record last observed (p.PodUID is set from
// it), before anything runs: the record comes first. It refuses with
// ErrProcessLimit when the sandbox has lim.Running running processes, and
// forgets the oldest finished processes past lim.Finished, whose ids it
// returns so their state in the sandbox can be removed too.
func (s *Store) StartProcess(ctx context.Context, orgID string, p Process, lim ProcessLimits) (Process, []string, error) {
	cmd, err := json.Marshal(p.Command)
	if err != nil {
		return Process{}, nil, err
	}
	var forgot []string
	err = s.inTx(ctx, func(tx *txn) error {
		sb, err := sandboxInTx(ctx, tx, orgID, p.SandboxID)
		if err != nil {
			return err
		}
		var running int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM processes WHERE sandbox_id = ? AND state = 'running'`, p.SandboxID).Scan(&running); err != nil {
			return err
		}
		if running >= lim.Running {
			return ErrProcessLimit
		}
		if forgot, err = forgetFinished(ctx, tx, p.SandboxID, lim.Finished); err != nil {
			return err
		}
		p.State, p.PodUID = ProcessRunning, sb.PodUID
		p.StartedAt = s.now().UTC().Truncate(time.Millisecond)
		_, err = tx.ExecContext(ctx, `INSERT INTO processes (id, sandbox_id, command, state, pod_uid, started_at) VALUES (?, ?, ?, ?, ?, ?)`,
			p.ID, p.SandboxID, string(cmd), p.State, p.PodUID, ms(p.StartedAt))
		return err
	})
	if err != nil {
		return Process{}, nil, fmt.Errorf("start process: %w", err)
	}
	return p, forgot, nil
}

// forgetFinished deletes the sandbox's finished processes but the newest
// keep, and returns their ids.
func forgetFinished(ctx context.Context, tx *txn, sandboxID string, keep int) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id FROM processes WHERE sandbox_id = ? AND state != 'running'
		ORDER BY started_at DESC, rowid DESC LIMIT -1 OFFSET ?`, sandboxID, max(keep, 0))
	if err != nil {
		return nil, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `DELETE FROM processes WHERE id = ?`, id); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// Processes lists one of an organization's sandboxes' processes, newest
// first. Another organization's sandbox is ErrNotFound.
func (s *Store) Processes(ctx context.Context, orgID, sandboxID string) ([]Process, error) {
	if _, err := s.Sandbox(ctx, orgID, sandboxID); err != nil {
		return nil, err
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+processColumns+` FROM processes p WHERE p.sandbox_id = ? ORDER BY p.started_at DESC, p.rowid DESC`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("processes: %w", err)
	}
	defer rows.Close()
	var out []Process
	for rows.Next() {
		p, err := scanProcess(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Process returns one process of one of an organization's sandboxes. A
// process of another sandbox or organization is ErrNotFound, as is every
// process for an empty orgID.
func (s *Store) Process(ctx context.Context, orgID, sandboxID, id string) (Process, error) {
	if orgID == "" {
		return Process{}, fmt.Errorf("process %q: %w", id, errNoOrg)
	}
	p, err := scanProcess(s.read.QueryRowContext(ctx, `SELECT `+processColumns+` FROM processes p JOIN sandboxes s ON s.id = p.sandbox_id
		WHERE p.id = ? AND p.sandbox_id = ? AND s.org_id = ?`, id, sandboxID, orgID))
	if errors.Is(err, sql.ErrNoRows) {
		return Process{}, fmt.Errorf("process %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Process{}, fmt.Errorf("process: %w", err)
	}
	return p, nil
}

// ExitProcess records that a running process exited with code. It reports
// whether it wrote: a process the record holds as finished stays as it is.
func (s *Store) ExitProcess(ctx context.Context, id string, code int) (bool, error) {
	return s.finishProcess(ctx, id, ProcessExited, &code, "")
}

// EndProcess records that a running process ended without an exit status
// hiloop saw, for reason. It reports whether it wrote.
func (s *Store) EndProcess(ctx context.Context, id string, reason EndReason) (bool, error) {
	return s.finishProcess(ctx, id, ProcessEnded, nil, reason)
}

func (s *Store) finishProcess(ctx context.Context, id string, state ProcessState, code *int, reason EndReason) (bool, error) {
	var exit sql.NullInt64
	if code != nil {
		exit = sql.NullInt64{Int64: int64(*code), Valid: true}
	}
	res, err := s.write.ExecContext(ctx, `UPDATE processes SET state = ?, exit_code = ?, end_reason = ?, ended_at = ? WHERE id = ? AND state = 'running'`,
		state, exit, reason, ms(s.now()), id)
	if err != nil {
		return false, fmt.Errorf("finish process: %w", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// endProcesses ends the running processes of sandbox id that cannot
// outlive what observation o says of its pod: all of them when the sandbox
// stops (or went), and those of another pod than the observed one while it
// starts or runs. Other states (attention, quarantined) say nothing sure
// of the pod, and change nothing.
func endProcesses(ctx context.Context, tx *txn, id string, o Observation, at time.Time) error {
	switch o.State {
	case StateStopping, StateStopped, StateExited, StateExpired, StateDeleted, StateLost:
		_, err := tx.ExecContext(ctx, `UPDATE processes SET state = 'ended', end_reason = ?, ended_at = ? WHERE sandbox_id = ? AND state = 'running'`,
			EndSandboxStopped, ms(at), id)
		return err
	case StateStarting, StateRunning:
		_, err := tx.ExecContext(ctx, `UPDATE processes SET state = 'ended', end_reason = ?, ended_at = ? WHERE sandbox_id = ? AND state = 'running' AND pod_uid != ?`,
			EndPodReplaced, ms(at), id, o.PodUID)
		return err
	}
	return nil
}
