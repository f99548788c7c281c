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

	"github.com/hiloop/hiloop/receipt"
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

// StopCause says who asked a sandbox to stop.
type StopCause string

// Stop causes. Only a sandbox stopped for idleness may be woken by its
// owner's next use.
const (
	StopUser StopCause = "user"
	StopIdle StopCause = "idle"
)

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
	Transports []receipt.Transport `json:"transports,omitempty"`
	// Env is the workload's environment beside the image's. It is stored
	// in a column of its own (env), never in the spec's JSON.
	Env map[string]string `json:"-"`
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
	// receipt.Receipt); "" for records older than the column.
	Receipt string
	// ModeOutside reports that the sandbox is observed stopped or stopping
	// while the API last asked it to run.
	ModeOutside bool
	// PodUID is the live pod last observed.
	PodUID string
	// HelperKeyChangedPod is the pod whose session helper changed its
	// host key within the pod's life, as the gateway saw it.
	HelperKeyChangedPod string
	// RuntimePod is the last pod whose runtime was observed from inside
	// it (runtime attestation), RuntimeObserved what was seen there and
	// RuntimeRelease the kernel release read; all "" before the first.
	RuntimePod      string
	RuntimeObserved receipt.Runtime
	RuntimeRelease  string
	// IdleTimeout stops the sandbox once it ran this long without use
	// through hiloop; 0 never does.
	IdleTimeout time.Duration
	// LastActivityAt is when its idle clock last started: the end of the
	// last session or channel, a touch, or the moment it came up running.
	LastActivityAt time.Time
	// ActivityOpen says a session or channel was open into it when the
	// record was last written.
	ActivityOpen bool
	// StopCause says who last asked it to stop: StopUser (or "" for a
	// record older than the column) or StopIdle.
	StopCause StopCause
}

// IdleStopped reports whether the sandbox was asked to stop for idleness
// and has not been asked anything since: the only stop a wake undoes.
func (sb Sandbox) IdleStopped() bool {
	return sb.DesiredMode == ModeStopped && sb.StopCause == StopIdle
}

// NewSandbox is what CreateSandbox needs.
type NewSandbox struct {
	OrgID     string
	Spec      Spec
	ExpiresAt *time.Time
	// Receipt is what the control plane promises for the sandbox.
	Receipt string
	// IdleTimeout is the sandbox's idle timeout; 0 is off. With
	// OrgIdleTimeout, it is the default: the organization's own timeout,
	// read in the create's transaction, takes its place when it has one.
	IdleTimeout    time.Duration
	OrgIdleTimeout bool
	// IdempotencyKey, when set, makes a retried create return the first
	// sandbox. RequestHash tells a true retry from a reuse of the key.
	IdempotencyKey string
	RequestHash    string
}

const sandboxColumns = `id, org_id, spec, desired_mode, state, anomaly, exit_code, reason, expires_at, created_at, updated_at, receipt, mode_outside, pod_uid, helper_key_changed_pod,
	idle_timeout, last_activity_at, activity_open, stop_cause, runtime_pod, runtime_observed, runtime_release, env`

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var sb Sandbox
	var spec, env string
	var exit sql.NullInt64
	var expires sql.NullInt64
	var created, updated, idle, active int64
	if err := row.Scan(&sb.ID, &sb.OrgID, &spec, &sb.DesiredMode, &sb.State, &sb.Anomaly, &exit, &sb.Reason, &expires, &created, &updated, &sb.Receipt, &sb.ModeOutside, &sb.PodUID, &sb.HelperKeyChangedPod,
		&idle, &active, &sb.ActivityOpen, &sb.StopCause, &sb.RuntimePod, &sb.RuntimeObserved, &sb.RuntimeRelease, &env); err != nil {
		return Sandbox{}, err
	}
	sb.IdleTimeout, sb.LastActivityAt = time.Duration(idle)*time.Second, fromMS(active)
	if err := json.Unmarshal([]byte(spec), &sb.Spec); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: spec: %w", sb.ID, err)
	}
	if env != "{}" {
		if err := json.Unmarshal([]byte(env), &sb.Spec.Env); err != nil {
			return Sandbox{}, fmt.Errorf("sandbox %s: env: %w", sb.ID, err)
		}
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
	env := []byte("{}")
	if len(n.Spec.Env) > 0 {
		if env, err = json.Marshal(n.Spec.Env); err != nil {
			return Sandbox{}, false, err
		}
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
		orgIdle, err := checkQuota(ctx, tx, n.OrgID, true)
		if err != nil {
			return err
		}
		idle := n.IdleTimeout
		if n.OrgIdleTimeout && orgIdle != nil {
			idle = *orgIdle
		}
		now := s.now().UTC().Truncate(time.Millisecond)
		sb = Sandbox{ID: NewID("sbx"), OrgID: n.OrgID, Spec: n.Spec, DesiredMode: ModeRunning, State: StatePending,
			ExpiresAt: n.ExpiresAt, CreatedAt: now, UpdatedAt: now, Receipt: n.Receipt,
			IdleTimeout: idle.Truncate(time.Second), LastActivityAt: now}
		var idem, hash sql.NullString
		if n.IdempotencyKey != "" {
			idem = sql.NullString{String: n.IdempotencyKey, Valid: true}
			hash = sql.NullString{String: n.RequestHash, Valid: true}
		}
		if _, err := tx.ExecContext(ctx, insertSandboxSQL,
			sb.ID, sb.OrgID, string(spec), sb.DesiredMode, sb.State, nullMS(sb.ExpiresAt), ms(now), ms(now), sb.Receipt,
			int64(sb.IdleTimeout/time.Second), ms(now), string(env), idem, hash); err != nil {
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
// row, however many sandboxes the organization holds. It also reads the
// organization's idle timeout, which a create takes when it asks for none.
const quotaSQL = `SELECT o.max_sandboxes, o.max_running, coalesce(c.live, 0), coalesce(c.running, 0), o.idle_timeout
	FROM orgs o LEFT JOIN org_counts c ON c.org_id = o.id WHERE o.id = ?`

// The statements of a create's write transaction, and the reads of the
// record that every write transaction makes, run prepared (see writeSQL).
const (
	anySandboxSQL    = `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ?`
	orgSandboxSQL    = `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ? AND org_id = ?`
	insertSandboxSQL = `INSERT INTO sandboxes (` + sandboxColumns + `, idempotency_key, request_hash)
		VALUES (?, ?, ?, ?, ?, '', NULL, '', ?, ?, ?, ?, 0, '', '', ?, ?, 0, '', '', '', '', ?, ?, ?)`
)

// checkQuota returns ErrQuota when the organization has no room for one more
// sandbox (all=true) or one more running sandbox. It returns the
// organization's idle timeout, nil when it has none of its own.
func checkQuota(ctx context.Context, tx *txn, orgID string, all bool) (idle *time.Duration, err error) {
	var maxAll, maxRunning, live, running int
	var idleS sql.NullInt64
	err = tx.QueryRowContext(ctx, quotaSQL, orgID).Scan(&maxAll, &maxRunning, &live, &running, &idleS)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("org %q: %w", orgID, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if all && live >= maxAll {
		return nil, fmt.Errorf("organization has %d of %d sandboxes: %w", live, maxAll, ErrQuota)
	}
	if running >= maxRunning {
		return nil, fmt.Errorf("organization has %d of %d running sandboxes: %w", running, maxRunning, ErrQuota)
	}
	return seconds(idleS), nil
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
