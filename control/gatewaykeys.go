package control

import (
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// helperLoginSalt separates the keys HelperLoginKey derives from anything
// else that might ever be derived from the gateway key.
const helperLoginSalt = "hiloop session helper login v1"

// HelperLoginKey is the key the gateway logs in to one sandbox's session
// helper with, derived from a gateway key: an ed25519 key whose seed is
// HKDF-SHA256 of the gateway key's seed with the sandbox id as the info.
// Only that sandbox's pod is given its public key, so the helper of any
// other sandbox that answers a dial refuses the login; and one stored
// secret still makes every sandbox's key, so nothing per sandbox is kept
// and a rotation re-derives them all.
func HelperLoginKey(gateway ed25519.PrivateKey, sandboxID string) (ed25519.PrivateKey, error) {
	if len(gateway) != ed25519.PrivateKeySize || sandboxID == "" {
		return nil, errors.New("helper login key: a gateway key and a sandbox id are required")
	}
	seed, err := hkdf.Key(sha256.New, gateway.Seed(), []byte(helperLoginSalt), sandboxID, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("helper login key: %w", err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// HelperAuthorizedKey is HelperLoginKey's public key in authorized_keys
// form, as the sandbox's pod carries it.
func HelperAuthorizedKey(gateway ed25519.PrivateKey, sandboxID string) (string, error) {
	k, err := HelperLoginKey(gateway, sandboxID)
	if err != nil {
		return "", err
	}
	pub, err := gossh.NewPublicKey(k.Public())
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pub))), nil
}

// GatewayKeys are the keys the gateway logs in to the session helper of the
// session's sandbox with, derived for that sandbox alone: from the current
// gateway key first, then from the one it replaced, which helpers whose
// annotation was not refreshed yet still accept.
func (c *Control) GatewayKeys(ctx context.Context, s *Session) ([]ed25519.PrivateKey, error) {
	cur, err := c.o.Store.PrivateKey(ctx, store.KeyGateway)
	if err != nil {
		return nil, err
	}
	prev, err := c.o.Store.OptionalPrivateKey(ctx, store.KeyGatewayPrevious)
	if err != nil {
		return nil, err
	}
	var keys []ed25519.PrivateKey
	for _, k := range []ed25519.PrivateKey{cur, prev} {
		if k == nil {
			continue
		}
		key, err := HelperLoginKey(k, s.SandboxID)
		if err != nil {
			return nil, err
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// helperKey is the public key the gateway logs in to the record's session
// helper with, authorized_keys form, derived from the current gateway key
// for this sandbox alone; "" for a record whose receipt has no helper.
// Reading it at every such create means a rotation reaches new sandboxes at
// once.
func (c *Control) helperKey(ctx context.Context, rec store.Sandbox) (string, error) {
	if receipt.Record(rec.Receipt).SessionPort == 0 {
		return "", nil
	}
	key, err := c.o.Store.PrivateKey(ctx, store.KeyGateway)
	if err != nil {
		return "", fmt.Errorf("read the gateway key: %w", err)
	}
	return HelperAuthorizedKey(key, rec.ID)
}

// PinHelperKey holds the helper of the session's sandbox, in pod podUID,
// to the first host key it showed in that pod (see store.PinHelperKey) and
// returns the fingerprint pinned for the pod. When that is not fp, the
// mirror is told, and turns the sandbox to attention with
// helper_host_key_changed.
func (c *Control) PinHelperKey(ctx context.Context, s *Session, podUID, fp string) (string, error) {
	pinned, err := c.o.Store.PinHelperKey(ctx, s.SandboxID, podUID, fp)
	if err != nil {
		return "", err
	}
	if pinned != fp {
		c.touch(s.SandboxID)
	}
	return pinned, nil
}

// GatewayKeyWriter hands sandboxes their helpers' login keys:
// k8s.Writer satisfies it. key gives the one for each sandbox id.
type GatewayKeyWriter interface {
	RotateGatewayKey(ctx context.Context, callTimeout time.Duration, key func(id string) (string, error)) (int, error)
}

// RotateGatewayKey gives the gateway a new key and hands every sandbox with
// a session helper the login key derived for it from the new one, each
// cluster call bounded by callTimeout. The key it replaced stays as the
// previous one, which the gateway still tries (GatewayKeys) until every
// helper has the new one, so a rotation cut short is finished by running it
// again. A running serve uses the new key from its next dial. It returns
// the new key's public key and how many sandboxes were handed theirs.
func RotateGatewayKey(ctx context.Context, db *store.Store, cluster GatewayKeyWriter, callTimeout time.Duration) (gossh.PublicKey, int, error) {
	key, err := db.RotateGatewayKey(ctx)
	if err != nil {
		return nil, 0, err
	}
	pub, err := gossh.NewPublicKey(key.Public())
	if err != nil {
		return nil, 0, err
	}
	n, err := cluster.RotateGatewayKey(ctx, callTimeout, func(id string) (string, error) { return HelperAuthorizedKey(key, id) })
	return pub, n, err
}
