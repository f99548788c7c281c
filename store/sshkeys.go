package store

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// SSHKey is a public key registered for SSH access to an organization's
// sandboxes. Each organization registers a public key at most once; other
// organizations may register the same public key, each its own SSHKey with
// its own id.
type SSHKey struct {
	ID          string
	OrgID       string
	Name        string
	Fingerprint string
	PublicKey   string
	CreatedAt   time.Time
}

// ErrKeyRegistered reports an SSH key that the organization has already
// registered. Another organization's registration of the same key is never
// a reason for it: public keys are public, and the answer must not say
// whether someone else holds one.
var ErrKeyRegistered = errors.New("this SSH public key is already registered in this organization")

// sshKeyPrefix starts every SSH key id, so a session's key id says which
// table it lives in.
const sshKeyPrefix = "sshk"

// IsSSHKeyID reports whether id names an SSH key (not an API key).
func IsSSHKeyID(id string) bool { return strings.HasPrefix(id, sshKeyPrefix+"_") }

// AddSSHKey registers a public key (in authorized_keys form) for an
// organization, unless the organization already has max SSH keys, which is
// a *KeyLimitError (max 0 sets no limit), or has registered this key,
// which is ErrKeyRegistered. The count and the insert are one write
// transaction, so concurrent adds cannot pass the limit together.
func (s *Store) AddSSHKey(ctx context.Context, orgID, name string, key gossh.PublicKey, max int) (SSHKey, error) {
	if orgID == "" {
		return SSHKey{}, fmt.Errorf("add ssh key: %w", errNoOrg)
	}
	k := SSHKey{ID: NewID(sshKeyPrefix), OrgID: orgID, Name: name, Fingerprint: gossh.FingerprintSHA256(key),
		PublicKey: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key))), CreatedAt: s.now().UTC().Truncate(time.Millisecond)}
	err := s.inTx(ctx, func(tx *txn) error {
		if max > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM ssh_keys WHERE org_id = ?`, orgID).Scan(&n); err != nil {
				return err
			}
			if n >= max {
				return &KeyLimitError{Kind: "SSH", Max: max}
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO ssh_keys (id, org_id, name, fingerprint, public_key, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			k.ID, k.OrgID, k.Name, k.Fingerprint, k.PublicKey, ms(k.CreatedAt))
		return err
	})
	if isUnique(err) {
		return SSHKey{}, ErrKeyRegistered
	}
	var kl *KeyLimitError
	if errors.As(err, &kl) {
		return SSHKey{}, kl
	}
	if err != nil {
		return SSHKey{}, fmt.Errorf("add ssh key: %w", err)
	}
	return k, nil
}

// SSHKeys lists an organization's SSH keys.
func (s *Store) SSHKeys(ctx context.Context, orgID string) ([]SSHKey, error) {
	if orgID == "" {
		return nil, fmt.Errorf("list ssh keys: %w", errNoOrg)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT id, org_id, name, fingerprint, public_key, created_at FROM ssh_keys WHERE org_id = ? ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("list ssh keys: %w", err)
	}
	defer rows.Close()
	var out []SSHKey
	for rows.Next() {
		k, err := scanSSHKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

func scanSSHKey(row interface{ Scan(...any) error }) (SSHKey, error) {
	var k SSHKey
	var created int64
	if err := row.Scan(&k.ID, &k.OrgID, &k.Name, &k.Fingerprint, &k.PublicKey, &created); err != nil {
		return SSHKey{}, err
	}
	k.CreatedAt = fromMS(created)
	return k, nil
}

// DeleteSSHKey removes one of an organization's SSH keys.
func (s *Store) DeleteSSHKey(ctx context.Context, orgID, id string) error {
	if orgID == "" {
		return fmt.Errorf("delete ssh key: %w", errNoOrg)
	}
	res, err := s.write.ExecContext(ctx, `DELETE FROM ssh_keys WHERE id = ? AND org_id = ?`, id, orgID)
	if err != nil {
		return fmt.Errorf("delete ssh key: %w", err)
	}
	return affected(res, "ssh key")
}

// SSHKeyForSandbox is the organization's registration of the key with this
// SHA256 fingerprint, where the organization is the one that owns sandbox
// id: key and sandbox are resolved in one lookup, so a registration of the
// same public key by another organization never authorizes a login to this
// one's sandbox. ErrNotFound when the sandbox does not exist or its
// organization has not registered the key; the two are not told apart.
func (s *Store) SSHKeyForSandbox(ctx context.Context, fingerprint, id string) (SSHKey, error) {
	if fingerprint == "" || id == "" {
		return SSHKey{}, ErrNotFound
	}
	k, err := scanSSHKey(s.read.QueryRowContext(ctx, `SELECT k.id, k.org_id, k.name, k.fingerprint, k.public_key, k.created_at
		FROM sandboxes s JOIN ssh_keys k ON k.org_id = s.org_id AND k.fingerprint = ? WHERE s.id = ? AND s.org_id != ''`, fingerprint, id))
	if errors.Is(err, sql.ErrNoRows) {
		return SSHKey{}, ErrNotFound
	}
	if err != nil {
		return SSHKey{}, fmt.Errorf("ssh key: %w", err)
	}
	return k, nil
}

// Names of the SSH key pairs the record keeps.
const (
	// KeyHost is the gateway's host key, which clients pin.
	KeyHost = "ssh_host_key"
	// KeyGateway is the key the gateway logs in to session helpers with;
	// KeyGatewayPrevious is the one it replaced, still tried until every
	// helper has the new one.
	KeyGateway         = "ssh_gateway_key"
	KeyGatewayPrevious = "ssh_gateway_key_previous"
)

// HostKey returns the SSH gateway's ed25519 host key, creating it on first
// use in the same transaction that records it. A stored key that cannot be
// read is an error, never silently replaced: clients pin it.
func (s *Store) HostKey(ctx context.Context) (gossh.Signer, error) {
	return s.KeyPair(ctx, KeyHost)
}

// KeyPair returns the named ed25519 key pair, creating it on first use.
// Once it exists, reading it takes no write transaction.
func (s *Store) KeyPair(ctx context.Context, name string) (gossh.Signer, error) {
	priv, err := s.PrivateKey(ctx, name)
	if err != nil {
		return nil, err
	}
	return gossh.NewSignerFromKey(priv)
}

// PrivateKey is the named key pair's ed25519 private key itself, created on
// first use as KeyPair makes it: the gateway derives each sandbox's helper
// login key from its own.
func (s *Store) PrivateKey(ctx context.Context, name string) (ed25519.PrivateKey, error) {
	var pemText string
	err := s.queryRow(ctx, `SELECT value FROM settings WHERE key = ?`, name).Scan(&pemText)
	if err == nil {
		return parseKeyPEM(name, pemText)
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	err = s.inTx(ctx, func(tx *txn) error {
		err := tx.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, name).Scan(&pemText)
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if pemText, err = newKeyPEM(); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?)`, name, pemText)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return parseKeyPEM(name, pemText)
}

// OptionalPrivateKey returns the named key pair's private key, or nil when
// there is none.
func (s *Store) OptionalPrivateKey(ctx context.Context, name string) (ed25519.PrivateKey, error) {
	var pemText string
	err := s.read.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, name).Scan(&pemText)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return parseKeyPEM(name, pemText)
}

// RotateGatewayKey makes a new gateway key and keeps the current one as the
// previous, in one transaction, and returns the new one.
func (s *Store) RotateGatewayKey(ctx context.Context) (ed25519.PrivateKey, error) {
	pemText, err := newKeyPEM()
	if err != nil {
		return nil, err
	}
	err = s.inTx(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO settings (key, value) SELECT ?, value FROM settings WHERE key = ?`, KeyGatewayPrevious, KeyGateway); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)`, KeyGateway, pemText)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("rotate gateway key: %w", err)
	}
	return parseKeyPEM(KeyGateway, pemText)
}

func newKeyPEM() (string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	block, err := gossh.MarshalPrivateKey(priv, "hiloop")
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(block)), nil
}

func parseKeyPEM(name, pemText string) (ed25519.PrivateKey, error) {
	key, err := gossh.ParseRawPrivateKey([]byte(pemText))
	if err == nil {
		switch k := key.(type) {
		case *ed25519.PrivateKey:
			return *k, nil
		case ed25519.PrivateKey:
			return k, nil
		}
		err = fmt.Errorf("a %T, not an ed25519 key", key)
	}
	return nil, fmt.Errorf("%s in the record is unreadable (not replaced: what was made from it would break): %w", name, err)
}
