package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hiloop/hiloop/store"
)

// TestPreviews: a preview's token is kept only as a hash (no copy of it in
// the database file); it finds its preview only with the preview's id,
// until it expires, is deleted, or the key that made it is revoked; the
// cap counts live previews only; another organization sees none of it.
func TestPreviews(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "h.db")
	s := open(t, path, nil)
	org, err := s.CreateOrg(ctx, "acme", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := s.CreateOrg(ctx, "other", 0, 0)
	key, _, _ := s.CreateKey(ctx, org.ID, "a")
	s.CreateKey(ctx, org.ID, "b")
	sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	p, token := store.NewPreview(org.ID, sb.ID, key.ID, 3000, store.PreviewAuthToken, now, time.Minute)
	if err := s.CreatePreview(ctx, p, token, 2); err != nil {
		t.Fatal(err)
	}
	kp, none := store.NewPreview(org.ID, sb.ID, key.ID, 3001, store.PreviewAuthKey, now, time.Hour)
	if none != "" {
		t.Fatalf("a key preview got a token")
	}
	if err := s.CreatePreview(ctx, kp, "", 2); err != nil {
		t.Fatal(err)
	}
	third, _ := store.NewPreview(org.ID, sb.ID, key.ID, 3002, store.PreviewAuthKey, now, time.Hour)
	if err := s.CreatePreview(ctx, third, "", 2); !errors.Is(err, store.ErrPreviewLimit) {
		t.Errorf("a third preview under a cap of 2: %v", err)
	}
	wrongOrg, _ := store.NewPreview(other.ID, sb.ID, key.ID, 3002, store.PreviewAuthKey, now, time.Hour)
	if err := s.CreatePreview(ctx, wrongOrg, "", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a preview of another organization's sandbox: %v", err)
	}

	if got, err := s.PreviewByToken(ctx, p.ID, token, now); err != nil || got.ID != p.ID || got.Port != 3000 {
		t.Errorf("by token: %+v %v", got, err)
	}
	many := []string{"hlp_a", "hl_key", "", token + "x"}
	if got, err := s.PreviewByTokens(ctx, p.ID, append(many, token), now); err != nil || got.ID != p.ID {
		t.Errorf("by one of several tokens: %+v %v", got, err)
	}
	past := make([]string, store.MaxPreviewTokens)
	for i := range past {
		past[i] = "hlp_" + strconv.Itoa(i)
	}
	for what, try := range map[string]func() error{
		"none of several tokens": func() error { _, err := s.PreviewByTokens(ctx, p.ID, many, now); return err },
		"a token past the bound": func() error { _, err := s.PreviewByTokens(ctx, p.ID, append(past, token), now); return err },
		"no token":               func() error { _, err := s.PreviewByTokens(ctx, p.ID, nil, now); return err },
		"another preview's id":   func() error { _, err := s.PreviewByToken(ctx, kp.ID, token, now); return err },
		"a wrong token":          func() error { _, err := s.PreviewByToken(ctx, p.ID, token+"x", now); return err },
		"expired":                func() error { _, err := s.PreviewByToken(ctx, p.ID, token, now.Add(time.Minute)); return err },
		"another organization":   func() error { _, err := s.LivePreview(ctx, other.ID, kp.ID, now); return err },
		"no organization":        func() error { _, err := s.LivePreview(ctx, "", kp.ID, now); return err },
	} {
		if err := try(); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: %v, want not found", what, err)
		}
	}
	if ps, _ := s.Previews(ctx, org.ID, sb.ID, now.Add(time.Minute)); len(ps) != 1 || ps[0].ID != kp.ID {
		t.Errorf("live previews once the first expired: %+v", ps)
	}
	// The expired one no longer counts against the cap.
	if err := s.CreatePreview(ctx, third, "", 2); err == nil {
		t.Error("created at the cap")
	}
	later, _ := store.NewPreview(org.ID, sb.ID, key.ID, 3002, store.PreviewAuthKey, now.Add(2*time.Minute), time.Hour)
	if err := s.CreatePreview(ctx, later, "", 2); err != nil {
		t.Errorf("a preview once the expired one is gone: %v", err)
	}

	if err := s.DeletePreview(ctx, other.ID, sb.ID, kp.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another organization deletes: %v", err)
	}
	if err := s.RevokeKey(ctx, org.ID, key.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LivePreview(ctx, org.ID, kp.ID, now); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a preview of a revoked key: %v", err)
	}
	if err := s.DeletePreview(ctx, org.ID, sb.ID, kp.ID); err != nil {
		t.Errorf("delete: %v", err)
	}

	s.Close()
	for _, f := range []string{path, path + "-wal"} {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, []byte(token)) || bytes.Contains(b, []byte(token[4:])) {
			t.Errorf("%s holds the token", f)
		}
	}
}
