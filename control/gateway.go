package control

import (
	"context"

	gossh "golang.org/x/crypto/ssh"

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
