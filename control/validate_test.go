package control

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// TestValidationNamesTheField: every refusal of a create or a PATCH is an
// ErrInvalid FieldError naming the field, the reserved volume prefix being
// the renderer's.
func TestValidationNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		req   api.CreateSandboxRequest
		idem  string
		field string
	}{
		{api.CreateSandboxRequest{}, "", "image"},
		{api.CreateSandboxRequest{Image: "busybox", TTL: "1s"}, "", "ttl"},
		{api.CreateSandboxRequest{Image: "busybox", IdleTimeout: "1ms"}, "", "idle_timeout"},
		{api.CreateSandboxRequest{Image: "busybox", Volumes: []api.VolumeRequest{{Name: k8s.GatewayKeyVolume, Size: "1Gi", MountPath: "/data"}}}, "", "volumes[0].name"},
		{api.CreateSandboxRequest{Image: "busybox", Labels: map[string]string{"a": "b c"}}, "", "labels.a"},
		{api.CreateSandboxRequest{Image: "busybox"}, string(make([]byte, MaxIdempotencyKey+1)), "Idempotency-Key"},
	} {
		_, err := NewCreateRequest(tc.req, tc.idem)
		var fe *FieldError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || fe.Field != tc.field {
			t.Errorf("create %+v: %v, want an invalid %s", tc.req, err, tc.field)
		}
	}
	for _, tc := range []struct {
		req   api.UpdateSandboxRequest
		field string
	}{
		{api.UpdateSandboxRequest{}, "ttl"},
		{api.UpdateSandboxRequest{TTL: "2h", IdleTimeout: "nope"}, "idle_timeout"},
		{api.UpdateSandboxRequest{TTL: "2000h", IdleTimeout: "5m"}, "ttl"},
	} {
		_, err := NewUpdate(tc.req)
		var fe *FieldError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || fe.Field != tc.field {
			t.Errorf("update %+v: %v, want an invalid %s", tc.req, err, tc.field)
		}
	}
}

// TestUpdateChecksEveryFieldFirst: an Update with one field outside its
// limits changes nothing, in the record or the cluster.
func TestUpdateChecksEveryFieldFirst(t *testing.T) {
	fc := &controltest.Cluster{}
	c, db, org := newControl(t, fc)
	ctx := context.Background()
	who := liveCaller(t, db, org.ID)
	sb, _, err := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox", TTLSeconds: 3600}})
	if err != nil {
		t.Fatal(err)
	}
	ttl, idle := 2*time.Hour, time.Millisecond
	if _, err := c.Update(ctx, who, sb.ID, Update{TTL: &ttl, IdleTimeout: &idle}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("update with an idle timeout of 1ms: %v, want invalid", err)
	}
	after, err := db.Sandbox(ctx, org.ID, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !after.ExpiresAt.Equal(*sb.ExpiresAt) || after.IdleTimeout != sb.IdleTimeout {
		t.Errorf("a refused update changed the record: expiry %v, idle %v", after.ExpiresAt, after.IdleTimeout)
	}
	for _, call := range fc.Calls() {
		if call == "expiry "+sb.ID {
			t.Errorf("a refused update reached the cluster")
		}
	}
}
