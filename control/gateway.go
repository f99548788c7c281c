package control

import (
	"context"
	"fmt"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/store"
)

// GatewayKeys are the keys the gateway logs in to session helpers with: the
// current one first, then the one it replaced, which helpers whose
// annotation was not refreshed yet still accept.
func (c *Control) GatewayKeys(ctx context.Context) ([]gossh.Signer, error) {
	cur, err := c.o.Store.KeyPair(ctx, store.KeyGateway)
	if err != nil {
		return nil, err
	}
	prev, err := c.o.Store.OptionalKeyPair(ctx, store.KeyGatewayPrevious)
	if err != nil || prev == nil {
		return []gossh.Signer{cur}, err
	}
	return []gossh.Signer{cur, prev}, nil
}

// helperKey is the gateway's current public key, authorized_keys form, for
// the object of a record whose receipt has a session helper; "" for any
// other. Reading it at every such create means a rotation reaches new
// sandboxes at once.
func (c *Control) helperKey(ctx context.Context, rec store.Sandbox) (string, error) {
	if sandbox.RecordReceipt(rec.Receipt).SessionPort == 0 {
		return "", nil
	}
	key, err := c.o.Store.KeyPair(ctx, store.KeyGateway)
	if err != nil {
		return "", fmt.Errorf("read the gateway key: %w", err)
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key.PublicKey()))), nil
}

// HelperKeyChanged records that the session's sandbox's helper, in pod
// podUID, showed another host key than the one pinned for that pod: the
// mirror turns it into the attention anomaly helper_host_key_changed.
func (c *Control) HelperKeyChanged(ctx context.Context, s *Session, podUID string) {
	if err := c.o.Store.MarkHelperKeyChanged(ctx, s.SandboxID, podUID); err != nil {
		c.log.Error("record helper host key change", "sandbox", s.SandboxID, "err", err)
	}
	c.touch(s.SandboxID)
}
