package control

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// TestPreviewSessionsEnd: a preview's visitor is admitted as a forward
// session held to the preview as to a key: a revoke ends its sessions at
// once and admits no more; an expiry, and a revoke of the key that made
// it, end them at the next sweep; a visitor of another preview, or with
// its own key, is untouched.
func TestPreviewSessionsEnd(t *testing.T) {
	ctx := context.Background()
	db, err := store.Open(ctx, store.Options{Path: filepath.Join(t.TempDir(), "c.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	fwd := []receipt.Transport{receipt.TransportExec, receipt.TransportForward}
	c, err := New(Options{Store: db, Cluster: &controltest.Cluster{Transports: fwd, SessionPort: 2223}, Exec: controltest.Exec{},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Caps: Capabilities{Transports: fwd},
		Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	org, _ := db.CreateOrg(ctx, "o", 10, 10)
	k1, _, _ := db.CreateKey(ctx, org.ID, "one")
	k2, _, _ := db.CreateKey(ctx, org.ID, "two")
	owner, other := Caller{OrgID: org.ID, KeyID: k1.ID}, Caller{OrgID: org.ID, KeyID: k2.ID}
	sb, _, err := c.Create(ctx, owner, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})

	// previewOf is the preview of each token made.
	previewOf := map[string]string{}
	visit := func(token string) (Caller, *Session) {
		t.Helper()
		who, _, err := c.PreviewVisitor(ctx, previewOf[token], PreviewCredential{Token: token})
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Admit(ctx, who, sb.ID, receipt.TransportForward)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.End)
		return who, s
	}
	newPreview := func(who Caller, ttl string) (store.Preview, string) {
		t.Helper()
		p, token, err := c.CreatePreview(ctx, who, sb.ID, PreviewRequest{Port: 80, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		previewOf[token] = p.ID
		return p, token
	}
	revoked, tokRevoked := newPreview(owner, "1h")
	_, tokExpiring := newPreview(owner, "1m")
	_, tokOfK2 := newPreview(other, "1h")
	_, tokKept := newPreview(owner, "1h")

	whoRevoked, sRevoked := visit(tokRevoked)
	_, sExpiring := visit(tokExpiring)
	_, sOfK2 := visit(tokOfK2)
	_, sKept := visit(tokKept)
	if whoRevoked.KeyID != owner.KeyID || whoRevoked.Preview != revoked.ID {
		t.Errorf("a token visitor acts as %+v", whoRevoked)
	}
	if err := c.RevokePreview(ctx, owner, sb.ID, revoked.ID); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(sRevoked.Context()), ErrPreviewRevoked) {
		t.Errorf("the revoked preview's session: %v", context.Cause(sRevoked.Context()))
	}
	if _, err := c.Admit(ctx, whoRevoked, sb.ID, receipt.TransportForward); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("an admission for the revoked preview: %v", err)
	}

	now.Add(int64(time.Minute))
	db.RevokeKey(ctx, org.ID, k2.ID, false)
	c.sweep(ctx)
	for what, s := range map[string]*Session{"expired": sExpiring, "made by a revoked key": sOfK2} {
		if s.Context().Err() == nil {
			t.Errorf("the session of a preview %s outlived the sweep", what)
		}
	}
	if sKept.Context().Err() != nil {
		t.Errorf("the live preview's session ended: %v", context.Cause(sKept.Context()))
	}
	if _, _, err := c.PreviewVisitor(ctx, previewOf[tokExpiring], PreviewCredential{Token: tokExpiring}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an expired preview's visitor: %v", err)
	}
}
