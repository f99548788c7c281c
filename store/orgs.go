package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// errNoOrg is what every organization-scoped method answers for an empty
// organization id: no access, never "any organization".
var errNoOrg = fmt.Errorf("no organization given: %w", ErrNotFound)

// ErrLastKey reports that revoking a key would leave its organization with
// no live key, locking it out until an operator acts offline.
var ErrLastKey = errors.New("it is the organization's last live key")

// ErrKeyLimit reports that an organization has as many live keys of a kind
// as it may have; errors.As finds a *KeyLimitError saying which.
var ErrKeyLimit = errors.New("key limit reached")

// KeyLimitError is ErrKeyLimit for one kind of key.
type KeyLimitError struct {
	// Kind is "API" or "SSH".
	Kind string
	// Max is the most live keys of the kind an organization may have.
	Max int
}

func (e *KeyLimitError) Error() string {
	return fmt.Sprintf("the organization has %d %s, the most it may have", e.Max, e.Keys())
}

// Keys names what is counted: live API keys, or SSH keys.
func (e *KeyLimitError) Keys() string {
	if e.Kind == "API" {
		return "live API keys"
	}
	return e.Kind + " keys"
}

// Is makes a *KeyLimitError match ErrKeyLimit.
func (e *KeyLimitError) Is(target error) bool { return target == ErrKeyLimit }

// orgName is what an organization may be called: a DNS label. Ids start with
// "org_", which no name can, so a reference is never ambiguous.
var orgName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ErrInvalidName reports an organization name that is not a DNS label.
var ErrInvalidName = errors.New("an organization name must be a lower-case DNS label of at most 63 characters")

// Org is an organization: the unit of ownership and isolation.
type Org struct {
	ID           string
	Name         string
	MaxSandboxes int
	MaxRunning   int
	CreatedAt    time.Time
	// IdleTimeout is the idle timeout of the organization's sandboxes
	// created without one; nil takes the deployment's default, 0 is off.
	IdleTimeout *time.Duration
}

// APIKey describes an API key. The secret itself is never stored.
type APIKey struct {
	ID        string
	OrgID     string
	Name      string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// Default quotas for a new organization.
const (
	DefaultMaxSandboxes = 50
	DefaultMaxRunning   = 20
)

// keyPrefix starts every API key secret, so a leaked key is recognisable.
const keyPrefix = "hl_"

// apiKeyPrefix starts every API key id, as sshKeyPrefix does SSH key ids.
const apiKeyPrefix = "key"

// CreateOrg creates an organization. A zero quota takes the default.
func (s *Store) CreateOrg(ctx context.Context, name string, maxSandboxes, maxRunning int) (Org, error) {
	if !orgName.MatchString(name) {
		return Org{}, fmt.Errorf("create org %q: %w", name, ErrInvalidName)
	}
	if maxSandboxes == 0 {
		maxSandboxes = DefaultMaxSandboxes
	}
	if maxRunning == 0 {
		maxRunning = DefaultMaxRunning
	}
	o := Org{ID: NewID("org"), Name: name, MaxSandboxes: maxSandboxes, MaxRunning: maxRunning, CreatedAt: s.now().UTC().Truncate(time.Millisecond)}
	_, err := s.write.ExecContext(ctx, `INSERT INTO orgs (id, name, max_sandboxes, max_running, created_at) VALUES (?, ?, ?, ?, ?)`,
		o.ID, o.Name, o.MaxSandboxes, o.MaxRunning, ms(o.CreatedAt))
	if isUnique(err) {
		return Org{}, fmt.Errorf("create org %q: %w", name, ErrConflict)
	}
	if err != nil {
		return Org{}, fmt.Errorf("create org: %w", err)
	}
	return o, nil
}

// SetQuota changes an organization's quotas.
func (s *Store) SetQuota(ctx context.Context, orgID string, maxSandboxes, maxRunning int) error {
	res, err := s.write.ExecContext(ctx, `UPDATE orgs SET max_sandboxes = ?, max_running = ? WHERE id = ?`, maxSandboxes, maxRunning, orgID)
	if err != nil {
		return fmt.Errorf("set quota: %w", err)
	}
	return affected(res, "org")
}

// Org returns one organization by id.
func (s *Store) Org(ctx context.Context, id string) (Org, error) {
	return s.org(ctx, `id = ?`, id)
}

// LookupOrg returns one organization by a reference an operator typed: an
// id (it starts with "org_") or else a name. Names cannot start with "org_",
// so the two never collide.
func (s *Store) LookupOrg(ctx context.Context, ref string) (Org, error) {
	if strings.HasPrefix(ref, "org_") {
		return s.org(ctx, `id = ?`, ref)
	}
	return s.org(ctx, `name = ?`, ref)
}

func (s *Store) org(ctx context.Context, where, arg string) (Org, error) {
	if arg == "" {
		return Org{}, errNoOrg
	}
	o, err := scanOrg(s.read.QueryRowContext(ctx, `SELECT `+orgColumns+` FROM orgs WHERE `+where, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return Org{}, fmt.Errorf("org %q: %w", arg, ErrNotFound)
	}
	if err != nil {
		return Org{}, fmt.Errorf("get org: %w", err)
	}
	return o, nil
}

const orgColumns = `id, name, max_sandboxes, max_running, created_at, idle_timeout`

func scanOrg(row interface{ Scan(...any) error }) (Org, error) {
	var o Org
	var created int64
	var idle sql.NullInt64
	if err := row.Scan(&o.ID, &o.Name, &o.MaxSandboxes, &o.MaxRunning, &created, &idle); err != nil {
		return Org{}, err
	}
	o.CreatedAt, o.IdleTimeout = fromMS(created), seconds(idle)
	return o, nil
}

// seconds is a nullable column of whole seconds as a duration, nil when
// NULL.
func seconds(n sql.NullInt64) *time.Duration {
	if !n.Valid {
		return nil
	}
	d := time.Duration(n.Int64) * time.Second
	return &d
}

// Orgs lists every organization by name.
func (s *Store) Orgs(ctx context.Context) ([]Org, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+orgColumns+` FROM orgs ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list orgs: %w", err)
	}
	defer rows.Close()
	var out []Org
	for rows.Next() {
		o, err := scanOrg(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// CreateKey issues a new API key for an organization and returns it with its
// secret, which is shown to the caller once and never stored. It is the
// operator's way (bootstrap, `hiloop key create --org`), bound by no limit;
// a caller's keys are made with CreateKeyWithin.
func (s *Store) CreateKey(ctx context.Context, orgID, name string) (APIKey, string, error) {
	return s.CreateKeyWithin(ctx, orgID, name, 0)
}

// CreateKeyWithin is CreateKey unless the organization already has max live
// (not revoked) keys, which is a *KeyLimitError; max 0 sets no limit. The
// count and the insert are one write transaction, so concurrent creates
// cannot pass the limit together.
func (s *Store) CreateKeyWithin(ctx context.Context, orgID, name string, max int) (APIKey, string, error) {
	if orgID == "" {
		return APIKey{}, "", fmt.Errorf("create key: %w", errNoOrg)
	}
	secret := newSecret()
	k := APIKey{ID: NewID(apiKeyPrefix), OrgID: orgID, Name: name, CreatedAt: s.now().UTC().Truncate(time.Millisecond)}
	err := s.inTx(ctx, func(tx *txn) error {
		if max > 0 {
			var live int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM api_keys WHERE org_id = ? AND revoked_at IS NULL`, orgID).Scan(&live); err != nil {
				return err
			}
			if live >= max {
				return &KeyLimitError{Kind: "API", Max: max}
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, org_id, name, hash, created_at) VALUES (?, ?, ?, ?, ?)`,
			k.ID, k.OrgID, k.Name, hashKey(secret), ms(k.CreatedAt))
		return err
	})
	if err != nil {
		if strings.Contains(err.Error(), "FOREIGN KEY") {
			return APIKey{}, "", fmt.Errorf("create key: org %q: %w", orgID, ErrNotFound)
		}
		return APIKey{}, "", fmt.Errorf("create key: %w", err)
	}
	return k, secret, nil
}

// Authenticate returns the live key whose secret is given. Any failure,
// including a revoked key, is ErrNotFound.
func (s *Store) Authenticate(ctx context.Context, secret string) (APIKey, error) {
	if !strings.HasPrefix(secret, keyPrefix) {
		return APIKey{}, ErrNotFound
	}
	var k APIKey
	var created int64
	err := s.queryRow(ctx, `SELECT id, org_id, name, created_at FROM api_keys WHERE hash = ? AND revoked_at IS NULL`, hashKey(secret)).
		Scan(&k.ID, &k.OrgID, &k.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, ErrNotFound
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("authenticate: %w", err)
	}
	k.CreatedAt = fromMS(created)
	return k, nil
}

// Keys lists an organization's keys.
func (s *Store) Keys(ctx context.Context, orgID string) ([]APIKey, error) {
	if orgID == "" {
		return nil, fmt.Errorf("list keys: %w", errNoOrg)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT id, org_id, name, created_at, revoked_at FROM api_keys WHERE org_id = ? ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		var created int64
		var revoked sql.NullInt64
		if err := rows.Scan(&k.ID, &k.OrgID, &k.Name, &created, &revoked); err != nil {
			return nil, err
		}
		k.CreatedAt, k.RevokedAt = fromMS(created), fromNullMS(revoked)
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeKey revokes one of an organization's keys. It refuses (ErrLastKey)
// to revoke the organization's last live key unless force is set.
func (s *Store) RevokeKey(ctx context.Context, orgID, keyID string, force bool) error {
	if orgID == "" {
		return fmt.Errorf("revoke key: %w", errNoOrg)
	}
	err := s.inTx(ctx, func(tx *txn) error {
		var live, target int
		if err := tx.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE id = ?) FROM api_keys WHERE org_id = ? AND revoked_at IS NULL`,
			keyID, orgID).Scan(&live, &target); err != nil {
			return err
		}
		if target == 0 {
			return fmt.Errorf("key %q: %w", keyID, ErrNotFound)
		}
		if live == 1 && !force {
			return ErrLastKey
		}
		_, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND org_id = ?`, ms(s.now()), keyID, orgID)
		return err
	})
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	return nil
}

// KeyLive reports whether keyID names a live key of the organization: an
// API key not revoked, or an SSH key still registered. The id's prefix says
// which table holds it; an empty organization or id, or an id of neither
// kind, is never live.
func (s *Store) KeyLive(ctx context.Context, orgID, keyID string) (bool, error) {
	var q string
	switch {
	case orgID == "" || keyID == "":
		return false, nil
	case IsSSHKeyID(keyID):
		q = `SELECT count(*) FROM ssh_keys WHERE id = ? AND org_id = ?`
	case strings.HasPrefix(keyID, apiKeyPrefix+"_"):
		q = `SELECT count(*) FROM api_keys WHERE id = ? AND org_id = ? AND revoked_at IS NULL`
	default:
		return false, nil
	}
	var n int
	if err := s.read.QueryRowContext(ctx, q, keyID, orgID).Scan(&n); err != nil {
		return false, fmt.Errorf("key live: %w", err)
	}
	return n > 0, nil
}

// Bootstrap creates the admin organization and its first key when no
// organization exists yet, and records that it did, in one transaction. It
// returns the secret, or "" when the deployment was already bootstrapped.
func (s *Store) Bootstrap(ctx context.Context, orgName string) (Org, string, error) {
	var org Org
	var secret string
	err := s.inTx(ctx, func(tx *txn) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM orgs) + (SELECT count(*) FROM settings WHERE key = 'bootstrapped_at')`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		now := s.now().UTC().Truncate(time.Millisecond)
		org = Org{ID: NewID("org"), Name: orgName, MaxSandboxes: DefaultMaxSandboxes, MaxRunning: DefaultMaxRunning, CreatedAt: now}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orgs (id, name, max_sandboxes, max_running, created_at) VALUES (?, ?, ?, ?, ?)`,
			org.ID, org.Name, org.MaxSandboxes, org.MaxRunning, ms(now)); err != nil {
			return err
		}
		secret = newSecret()
		if _, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, org_id, name, hash, created_at) VALUES (?, ?, 'admin', ?, ?)`,
			NewID(apiKeyPrefix), org.ID, hashKey(secret), ms(now)); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES ('bootstrapped_at', ?)`, now.Format(time.RFC3339Nano))
		return err
	})
	if err != nil {
		return Org{}, "", fmt.Errorf("bootstrap: %w", err)
	}
	return org, secret, nil
}

// newSecret returns a fresh API key secret: the prefix and 256 random bits.
func newSecret() string {
	raw := make([]byte, 32)
	rand.Read(raw)
	return keyPrefix + base64.RawURLEncoding.EncodeToString(raw)
}

func hashKey(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

func affected(res sql.Result, what string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return nil
}
