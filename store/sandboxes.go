package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// State is a sandbox's observed state. Only the status mirror (and the
// explicit failure of a cluster write) sets it; see docs/states.md.
type State string

// The states of DESIGN.md, plus failed: the cluster refused the write that
// would have made the sandbox, so it never existed there.
const (
	StatePending     State = "pending"
	StateStarting    State = "starting"
	StateRunning     State = "running"
	StateStopping    State = "stopping"
	StateStopped     State = "stopped"
	StateExited      State = "exited"
	StateExpired     State = "expired"
	StateDeleted     State = "deleted"
	StateLost        State = "lost"
	StateAttention   State = "attention"
	StateQuarantined State = "quarantined"
	StateFailed      State = "failed"
)

// States lists every state, for validation of filters.
var States = []State{StatePending, StateStarting, StateRunning, StateStopping, StateStopped, StateExited,
	StateExpired, StateDeleted, StateLost, StateAttention, StateQuarantined, StateFailed}

// Terminal reports whether no cluster object stands behind a sandbox in
// state s any more, so the mirror has nothing left to observe.
func (s State) Terminal() bool {
	return s == StateDeleted || s == StateLost || s == StateFailed
}

// terminalSQL is the SQL list of the terminal states.
const terminalSQL = `('deleted', 'lost', 'failed')`

// Mode is what the API last asked for.
type Mode string

// Desired modes.
const (
	ModeRunning Mode = "running"
	ModeStopped Mode = "stopped"
	ModeDeleted Mode = "deleted"
)

// Spec is the sandbox the user asked for, as validated by the API.
type Spec struct {
	Image          string            `json:"image"`
	CPURequest     string            `json:"cpu_request,omitempty"`
	CPULimit       string            `json:"cpu_limit,omitempty"`
	MemoryRequest  string            `json:"memory_request,omitempty"`
	MemoryLimit    string            `json:"memory_limit,omitempty"`
	TTLSeconds     int64             `json:"ttl_seconds,omitempty"`
	ShutdownPolicy string            `json:"shutdown_policy"`
	Volumes        []Volume          `json:"volumes,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// Transports are the ways in the sandbox asked for; empty means every
	// transport the deployment backed at create time.
	Transports []string `json:"transports,omitempty"`
}

// Volume is a persistent volume that lives as long as its sandbox.
type Volume struct {
	Name         string `json:"name"`
	Size         string `json:"size"`
	MountPath    string `json:"mount_path"`
	StorageClass string `json:"storage_class,omitempty"`
}

// Sandbox is one sandbox's record.
type Sandbox struct {
	ID          string
	OrgID       string
	Spec        Spec
	DesiredMode Mode
	State       State
	Anomaly     string
	ExitCode    *int
	Reason      string
	ExpiresAt   *time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// Receipt is what the control plane promised at create time (JSON, see
	// k8s.Receipt); "" for records older than the column.
	Receipt string
	// ModeOutside reports that the sandbox is observed stopped or stopping
	// while the API last asked it to run.
	ModeOutside bool
	// PodUID is the live pod last observed.
	PodUID string
	// HelperKeyChangedPod is the pod whose session helper changed its
	// host key within the pod's life, as the gateway saw it.
	HelperKeyChangedPod string
}

// Observation is what the mirror concluded from the cluster.
type Observation struct {
	State    State
	Anomaly  string
	ExitCode *int
	Reason   string
	// PodUID is the live pod observed, "" when there is none.
	PodUID string
}

// Event is one recorded state transition.
type Event struct {
	Seq    int64     `json:"seq"`
	At     time.Time `json:"at"`
	From   State     `json:"from"`
	To     State     `json:"to"`
	Reason string    `json:"reason,omitempty"`
}

// NewSandbox is what CreateSandbox needs.
type NewSandbox struct {
	OrgID     string
	Spec      Spec
	ExpiresAt *time.Time
	// Receipt is what the control plane promises for the sandbox.
	Receipt string
	// IdempotencyKey, when set, makes a retried create return the first
	// sandbox. RequestHash tells a true retry from a reuse of the key.
	IdempotencyKey string
	RequestHash    string
}

const sandboxColumns = `id, org_id, spec, desired_mode, state, anomaly, exit_code, reason, expires_at, created_at, updated_at, receipt, mode_outside, pod_uid, helper_key_changed_pod`

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var sb Sandbox
	var spec string
	var exit sql.NullInt64
	var expires sql.NullInt64
	var created, updated int64
	if err := row.Scan(&sb.ID, &sb.OrgID, &spec, &sb.DesiredMode, &sb.State, &sb.Anomaly, &exit, &sb.Reason, &expires, &created, &updated, &sb.Receipt, &sb.ModeOutside, &sb.PodUID, &sb.HelperKeyChangedPod); err != nil {
		return Sandbox{}, err
	}
	if err := json.Unmarshal([]byte(spec), &sb.Spec); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: spec: %w", sb.ID, err)
	}
	if exit.Valid {
		c := int(exit.Int64)
		sb.ExitCode = &c
	}
	sb.ExpiresAt = fromNullMS(expires)
	sb.CreatedAt, sb.UpdatedAt = fromMS(created), fromMS(updated)
	return sb, nil
}

// CreateSandbox writes a new sandbox record in state pending, desired
// running, after checking the organization's quotas in the same transaction.
// When the idempotency key was used before with the same request hash it
// returns that sandbox and created=false; with another hash, ErrConflict.
func (s *Store) CreateSandbox(ctx context.Context, n NewSandbox) (sb Sandbox, created bool, err error) {
	if n.OrgID == "" {
		return Sandbox{}, false, fmt.Errorf("create sandbox: %w", errNoOrg)
	}
	spec, err := json.Marshal(n.Spec)
	if err != nil {
		return Sandbox{}, false, err
	}
	err = s.inBatch(ctx, func(ctx context.Context, tx *txn) error {
		if n.IdempotencyKey != "" {
			var id, hash string
			err := tx.QueryRowContext(ctx, `SELECT id, request_hash FROM sandboxes WHERE org_id = ? AND idempotency_key = ?`, n.OrgID, n.IdempotencyKey).Scan(&id, &hash)
			if err == nil {
				if hash != n.RequestHash {
					return fmt.Errorf("idempotency key reused with a different request: %w", ErrConflict)
				}
				sb, err = scanSandbox(tx.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, id))
				return err
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		if err := checkQuota(ctx, tx, n.OrgID, true); err != nil {
			return err
		}
		now := s.now().UTC().Truncate(time.Millisecond)
		sb = Sandbox{ID: NewID("sbx"), OrgID: n.OrgID, Spec: n.Spec, DesiredMode: ModeRunning, State: StatePending,
			ExpiresAt: n.ExpiresAt, CreatedAt: now, UpdatedAt: now, Receipt: n.Receipt}
		var idem, hash sql.NullString
		if n.IdempotencyKey != "" {
			idem = sql.NullString{String: n.IdempotencyKey, Valid: true}
			hash = sql.NullString{String: n.RequestHash, Valid: true}
		}
		if _, err := tx.ExecContext(ctx, insertSandboxSQL,
			sb.ID, sb.OrgID, string(spec), sb.DesiredMode, sb.State, nullMS(sb.ExpiresAt), ms(now), ms(now), sb.Receipt, idem, hash); err != nil {
			return err
		}
		created = true
		return insertEvent(ctx, tx, sb.ID, now, "", StatePending, "created")
	})
	if err != nil {
		return Sandbox{}, false, fmt.Errorf("create sandbox: %w", err)
	}
	return sb, created, nil
}

// quotaSQL reads an organization's limits and its live and running
// sandboxes, which triggers count as the rows change (migration 0006): one
// row, however many sandboxes the organization holds.
const quotaSQL = `SELECT o.max_sandboxes, o.max_running, coalesce(c.live, 0), coalesce(c.running, 0)
	FROM orgs o LEFT JOIN org_counts c ON c.org_id = o.id WHERE o.id = ?`

// The statements of the hot write transactions, a create and an
// observation, run prepared (see writeSQL).
const (
	anySandboxSQL    = `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ?`
	orgSandboxSQL    = `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ? AND org_id = ?`
	insertSandboxSQL = `INSERT INTO sandboxes (` + sandboxColumns + `, idempotency_key, request_hash)
		VALUES (?, ?, ?, ?, ?, '', NULL, '', ?, ?, ?, ?, 0, '', '', ?, ?)`
	observeSQL = `UPDATE sandboxes SET state = ?, anomaly = ?, exit_code = ?, reason = ?, pod_uid = ?, mode_outside = ?,
		updated_at = ? WHERE id = ?`
	insertEventSQL = `INSERT INTO sandbox_events (sandbox_id, at, from_state, to_state, reason) VALUES (?, ?, ?, ?, ?)`
)

// checkQuota returns ErrQuota when the organization has no room for one more
// sandbox (all=true) or one more running sandbox.
func checkQuota(ctx context.Context, tx *txn, orgID string, all bool) error {
	var maxAll, maxRunning, live, running int
	err := tx.QueryRowContext(ctx, quotaSQL, orgID).Scan(&maxAll, &maxRunning, &live, &running)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("org %q: %w", orgID, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if all && live >= maxAll {
		return fmt.Errorf("organization has %d of %d sandboxes: %w", live, maxAll, ErrQuota)
	}
	if running >= maxRunning {
		return fmt.Errorf("organization has %d of %d running sandboxes: %w", running, maxRunning, ErrQuota)
	}
	return nil
}

// Sandbox returns one of an organization's sandboxes. Another org's sandbox
// is ErrNotFound like an absent one, and so is every sandbox for an empty
// orgID: scoping fails closed.
func (s *Store) Sandbox(ctx context.Context, orgID, id string) (Sandbox, error) {
	if orgID == "" {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, errNoOrg)
	}
	return s.getSandbox(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ? AND org_id = ?`, id, orgID)
}

// SandboxAnyOrg returns a sandbox of any organization. It is for the status
// mirror and the control plane's own bookkeeping, never for a caller's
// request.
func (s *Store) SandboxAnyOrg(ctx context.Context, id string) (Sandbox, error) {
	return s.getSandbox(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, id)
}

func (s *Store) getSandbox(ctx context.Context, q string, args ...any) (Sandbox, error) {
	id := args[0]
	sb, err := scanSandbox(s.queryRow(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// ListOptions filter and page ListSandboxes.
type ListOptions struct {
	OrgID  string
	State  State
	Labels map[string]string
	// After is the id of the last sandbox of the previous page.
	After string
	Limit int
}

// listQuery is the query of a page of ListSandboxes. It pages in rowid
// order, which the index sandboxes_org_rowid (org_id, and so rowid) gives
// without sorting the organization's rows.
func listQuery(o ListOptions) (string, []any, error) {
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE org_id = ?`
	args := []any{o.OrgID}
	if o.State != "" {
		q += ` AND state = ?`
		args = append(args, o.State)
	}
	keys := make([]string, 0, len(o.Labels))
	for k := range o.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.ContainsAny(k, `"\`) {
			return "", nil, fmt.Errorf("label key %q: %w", k, ErrNotFound)
		}
		q += ` AND json_extract(spec, ?) = ?`
		args = append(args, `$.labels."`+k+`"`, o.Labels[k])
	}
	if o.After != "" {
		q += ` AND rowid > coalesce((SELECT rowid FROM sandboxes WHERE id = ? AND org_id = ?), -1)`
		args = append(args, o.After, o.OrgID)
	}
	q += ` ORDER BY rowid LIMIT ?`
	args = append(args, o.Limit+1)
	return q, args, nil
}

// ListSandboxes lists an organization's sandboxes in creation order, one page
// at a time. next is the cursor of the following page, "" on the last.
func (s *Store) ListSandboxes(ctx context.Context, o ListOptions) (list []Sandbox, next string, err error) {
	if o.OrgID == "" {
		return nil, "", fmt.Errorf("list sandboxes: %w", errNoOrg)
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	q, args, err := listQuery(o)
	if err != nil {
		return nil, "", err
	}
	list, err = s.querySandboxes(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	if len(list) > o.Limit {
		list = list[:o.Limit]
		next = list[len(list)-1].ID
	}
	return list, next, nil
}

// Unsettled lists, across organizations, every sandbox that still has (or
// should have) a cluster object: the ones the mirror must reconcile.
func (s *Store) Unsettled(ctx context.Context) ([]Sandbox, error) {
	return s.querySandboxes(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE state NOT IN `+terminalSQL+` ORDER BY rowid`)
}

func (s *Store) querySandboxes(ctx context.Context, q string, args ...any) ([]Sandbox, error) {
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

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
func (s *Store) SetDesiredMode(ctx context.Context, orgID, id string, mode Mode) (ModeChange, error) {
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
			if err := checkQuota(ctx, tx, orgID, false); err != nil {
				return err
			}
		}
		sb.DesiredMode, sb.ModeOutside, sb.UpdatedAt = mode, false, s.now().UTC().Truncate(time.Millisecond)
		ch.After = sb
		_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET desired_mode = ?, mode_outside = 0, updated_at = ? WHERE id = ?`, mode, ms(sb.UpdatedAt), id)
		return err
	})
	if err != nil {
		return ModeChange{}, fmt.Errorf("set mode %s: %w", mode, err)
	}
	return ch, nil
}

// sandboxInTx reads one of an organization's sandboxes inside a write
// transaction; an empty orgID sees nothing.
func sandboxInTx(ctx context.Context, tx *txn, orgID, id string) (Sandbox, error) {
	if orgID == "" {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, errNoOrg)
	}
	sb, err := scanSandbox(tx.QueryRowContext(ctx, orgSandboxSQL, id, orgID))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	return sb, err
}

// anySandboxInTx is sandboxInTx for any organization, for the mirror's and
// the control plane's own writes.
func anySandboxInTx(ctx context.Context, tx *txn, id string) (Sandbox, error) {
	sb, err := scanSandbox(tx.QueryRowContext(ctx, anySandboxSQL, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	return sb, err
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
// its desired mode is running marks its mode as changed outside hiloop.
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
		if _, err := tx.ExecContext(ctx, observeSQL,
			o.State, o.Anomaly, exit, o.Reason, o.PodUID, outside, ms(now), id); err != nil {
			return err
		}
		changed = true
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

// MarkHelperKeyChanged records that the session helper of pod podUID showed
// another host key within the pod's life.
func (s *Store) MarkHelperKeyChanged(ctx context.Context, id, podUID string) error {
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET helper_key_changed_pod = ? WHERE id = ?`, podUID, id)
	if err != nil {
		return fmt.Errorf("mark helper key changed: %w", err)
	}
	return nil
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

// insertEvent records a state transition. Every change of a sandbox's state
// is one; the transaction wakes those waiting for it once it commits.
func insertEvent(ctx context.Context, tx *txn, id string, at time.Time, from, to State, reason string) error {
	tx.transitions = append(tx.transitions, id)
	_, err := tx.ExecContext(ctx, insertEventSQL, id, ms(at), from, to, reason)
	return err
}

// pruneBatch is how many events PruneEvents deletes per statement.
var pruneBatch = 1000

// PruneEvents deletes state transitions recorded before the cutoff,
// pruneBatch at a time so no write waits long behind it, and says how many
// went. The sandbox rows keep their current state; only history goes.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		res, err := s.write.ExecContext(ctx, `DELETE FROM sandbox_events WHERE seq IN
			(SELECT seq FROM sandbox_events WHERE at < ? ORDER BY seq LIMIT ?)`, ms(before), pruneBatch)
		if err != nil {
			return total, fmt.Errorf("prune events: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(pruneBatch) {
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

// RestoreMode puts back the desired mode (and the outside-mode mark) that a
// failed cluster write was meant to change. It checks nothing: it undoes, it
// does not ask.
func (s *Store) RestoreMode(ctx context.Context, before Sandbox) error {
	_, err := s.write.ExecContext(ctx, `UPDATE sandboxes SET desired_mode = ?, mode_outside = ?, updated_at = ? WHERE id = ?`,
		before.DesiredMode, before.ModeOutside, ms(s.now()), before.ID)
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

// Counts counts sandboxes by state, across organizations, and the
// organizations: the metrics' gauges.
func (s *Store) Counts(ctx context.Context) (map[string]int, int, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT state, count(*) FROM sandboxes GROUP BY state`)
	if err != nil {
		return nil, 0, fmt.Errorf("counts: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, 0, err
		}
		out[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var orgs int
	if err := s.read.QueryRowContext(ctx, `SELECT count(*) FROM orgs`).Scan(&orgs); err != nil {
		return nil, 0, fmt.Errorf("counts: %w", err)
	}
	return out, orgs, nil
}
