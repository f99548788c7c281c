package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrPreviewLimit reports that a sandbox has as many live previews as it may
// have.
var ErrPreviewLimit = errors.New("preview limit reached")

// Preview auth modes: a preview's visitor presents the preview's own token,
// or an API key of the preview's organization.
const (
	PreviewAuthToken = "token"
	PreviewAuthKey   = "key"
)

// previewPrefix starts every preview id, previewTokenPrefix every preview
// token, so a leaked token is recognisable and never taken for an API key.
const (
	previewPrefix      = "pv"
	previewTokenPrefix = "hlp_"
)

// Preview is one preview URL of a sandbox's port.
type Preview struct {
	ID        string
	OrgID     string
	SandboxID string
	// KeyID is the API key that made the preview; the preview works only
	// while it is live.
	KeyID     string
	Port      int
	Auth      string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// NewPreview is a preview of the sandbox's port with a fresh id, made now,
// and, for token auth, its token, which only the caller ever sees.
func NewPreview(orgID, sandboxID, keyID string, port int, auth string, now time.Time, ttl time.Duration) (Preview, string) {
	now = now.UTC().Truncate(time.Millisecond)
	p := Preview{ID: NewID(previewPrefix), OrgID: orgID, SandboxID: sandboxID, KeyID: keyID, Port: port, Auth: auth,
		CreatedAt: now, ExpiresAt: now.Add(ttl)}
	if auth != PreviewAuthToken {
		return p, ""
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	return p, previewTokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
}

// IsPreviewToken reports whether s has the form of a preview token.
func IsPreviewToken(s string) bool { return strings.HasPrefix(s, previewTokenPrefix) }

// IsKeySecret reports whether s has the form of an API key's secret.
func IsKeySecret(s string) bool { return strings.HasPrefix(s, keyPrefix) }

func hashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// CreatePreview records p, with the hash of its token (token auth), for a
// sandbox of p's organization that has fewer than max live previews
// (ErrPreviewLimit otherwise; no limit when max is 0). A sandbox that is
// not the organization's is ErrNotFound. Expired previews of the sandbox are
// deleted on the way.
func (s *Store) CreatePreview(ctx context.Context, p Preview, token string, max int) error {
	if p.OrgID == "" {
		return fmt.Errorf("create preview: %w", errNoOrg)
	}
	var hash []byte
	if token != "" {
		hash = hashToken(token)
	}
	err := s.inTx(ctx, func(tx *txn) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes WHERE id = ? AND org_id = ?`, p.SandboxID, p.OrgID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return ErrNotFound
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM previews WHERE sandbox_id = ? AND expires_at <= ?`, p.SandboxID, ms(p.CreatedAt)); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM previews WHERE sandbox_id = ?`, p.SandboxID).Scan(&n); err != nil {
			return err
		}
		if max > 0 && n >= max {
			return ErrPreviewLimit
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO previews (id, org_id, sandbox_id, key_id, port, auth, token_hash, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			p.ID, p.OrgID, p.SandboxID, p.KeyID, p.Port, p.Auth, hash, ms(p.CreatedAt), ms(p.ExpiresAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("create preview: %w", err)
	}
	return nil
}

// previewColumns are the columns scanPreview reads, in its order.
const previewColumns = `p.id, p.org_id, p.sandbox_id, p.key_id, p.port, p.auth, p.created_at, p.expires_at`

// livePreview is the condition of a preview that works at ?: not expired,
// and the key that made it live.
const livePreview = `p.expires_at > ? AND EXISTS (SELECT 1 FROM api_keys k WHERE k.id = p.key_id AND k.org_id = p.org_id AND k.revoked_at IS NULL)`

func scanPreview(sc interface{ Scan(...any) error }) (Preview, error) {
	var p Preview
	var created, expires int64
	if err := sc.Scan(&p.ID, &p.OrgID, &p.SandboxID, &p.KeyID, &p.Port, &p.Auth, &created, &expires); err != nil {
		return Preview{}, err
	}
	p.CreatedAt, p.ExpiresAt = fromMS(created), fromMS(expires)
	return p, nil
}

// Previews lists the previews of one of the organization's sandboxes that
// work at now, oldest first (in the order made, within one millisecond).
func (s *Store) Previews(ctx context.Context, orgID, sandboxID string, now time.Time) ([]Preview, error) {
	if orgID == "" {
		return nil, fmt.Errorf("list previews: %w", errNoOrg)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+previewColumns+` FROM previews p WHERE p.org_id = ? AND p.sandbox_id = ? AND `+livePreview+` ORDER BY p.created_at, p.rowid`,
		orgID, sandboxID, ms(now))
	if err != nil {
		return nil, fmt.Errorf("list previews: %w", err)
	}
	defer rows.Close()
	out := []Preview{}
	for rows.Next() {
		p, err := scanPreview(rows)
		if err != nil {
			return nil, fmt.Errorf("list previews: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list previews: %w", err)
	}
	return out, nil
}

// LivePreview is the organization's preview id as it works at now; a
// preview that is absent, another organization's, expired, revoked or
// whose key was revoked is ErrNotFound.
func (s *Store) LivePreview(ctx context.Context, orgID, id string, now time.Time) (Preview, error) {
	if orgID == "" || id == "" {
		return Preview{}, ErrNotFound
	}
	p, err := scanPreview(s.read.QueryRowContext(ctx, `SELECT `+previewColumns+` FROM previews p WHERE p.id = ? AND p.org_id = ? AND `+livePreview,
		id, orgID, ms(now)))
	return p, previewErr(err)
}

// PreviewByToken is the token-auth preview id whose token is token, as it
// works at now; anything else is ErrNotFound.
func (s *Store) PreviewByToken(ctx context.Context, id, token string, now time.Time) (Preview, error) {
	return s.PreviewByTokens(ctx, id, []string{token}, now)
}

// MaxPreviewTokens bounds the tokens PreviewByTokens tries at once.
const MaxPreviewTokens = 256

// PreviewByTokens is the token-auth preview id whose token is one of
// tokens (those past MaxPreviewTokens are not tried), as it works at now;
// anything else is ErrNotFound. It is one lookup however many tokens
// there are, the same whether id exists or not.
func (s *Store) PreviewByTokens(ctx context.Context, id string, tokens []string, now time.Time) (Preview, error) {
	args := []any{id, ms(now)}
	for _, t := range tokens {
		if len(args)-2 == MaxPreviewTokens {
			break
		}
		if IsPreviewToken(t) {
			args = append(args, hashToken(t))
		}
	}
	if id == "" || len(args) == 2 {
		return Preview{}, ErrNotFound
	}
	in := strings.TrimSuffix(strings.Repeat("?,", len(args)-2), ",")
	p, err := scanPreview(s.read.QueryRowContext(ctx, `SELECT `+previewColumns+` FROM previews p WHERE p.id = ? AND `+livePreview+` AND p.token_hash IN (`+in+`)`,
		args...))
	return p, previewErr(err)
}

func previewErr(err error) error {
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return fmt.Errorf("preview: %w", err)
	}
	return nil
}

// DeletePreview deletes one of the organization's sandbox's previews: its
// token, if any, stops working with it. ErrNotFound when there is none.
func (s *Store) DeletePreview(ctx context.Context, orgID, sandboxID, id string) error {
	if orgID == "" {
		return fmt.Errorf("delete preview: %w", errNoOrg)
	}
	res, err := s.write.ExecContext(ctx, `DELETE FROM previews WHERE id = ? AND org_id = ? AND sandbox_id = ?`, id, orgID, sandboxID)
	if err != nil {
		return fmt.Errorf("delete preview: %w", err)
	}
	return affected(res, "preview")
}
