package control

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// TestAttackCreateIdleIsolation: a caller of one organization gets its own
// organization's idle timeout, never another's; an explicit 0 wins over
// the organization's.
func TestAttackCreateIdleIsolation(t *testing.T) {
	c, db, a := newControl(t, &controltest.Cluster{})
	c.o.DefaultIdleTimeout = 9 * time.Minute
	ctx := context.Background()
	b, err := db.CreateOrg(ctx, "b", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	half := 30 * time.Minute
	if err := db.SetOrgIdleTimeout(ctx, a.ID, &half); err != nil {
		t.Fatal(err)
	}
	zero := time.Duration(0)
	for _, tc := range []struct {
		org  string
		ask  *time.Duration
		want time.Duration
	}{{a.ID, nil, half}, {b.ID, nil, 9 * time.Minute}, {a.ID, &zero, 0}, {b.ID, &zero, 0}} {
		sb, _, err := c.Create(ctx, liveCaller(t, db, tc.org), CreateRequest{Spec: store.Spec{Image: "busybox"}, IdleTimeout: tc.ask})
		if err != nil {
			t.Fatal(err)
		}
		if sb.OrgID != tc.org || sb.IdleTimeout != tc.want {
			t.Errorf("org %s ask %v: answer org %s idle %v, want %v", tc.org, tc.ask, sb.OrgID, sb.IdleTimeout, tc.want)
		}
	}
}

// TestAttackCreateRacingDeleteAnswer: whatever the order of a create and a
// delete of its record, no object outlives a deleted record, and an answer
// of a create whose cluster step found the delete does not say the sandbox
// is wanted running (TestCreateRacingDelete has the one interleaving).
func TestAttackCreateRacingDeleteAnswer(t *testing.T) {
	fc := &controltest.Cluster{}
	c, db, org := newControl(t, fc)
	ctx := context.Background()
	who := liveCaller(t, db, org.ID)
	// Racing for real, a deleter taking every record it sees.
	for i := range 40 {
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				list, _, _ := db.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, Limit: 100})
				for _, s := range list {
					if s.DesiredMode != store.ModeDeleted {
						c.SetMode(ctx, who, s.ID, store.ModeDeleted)
					}
				}
			}
		})
		got, _, err := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		close(done)
		wg.Wait()
		if errors.Is(err, store.ErrQuota) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		calls := fc.Calls()
		if !slices.Contains(calls, "create "+got.ID) && got.DesiredMode != store.ModeDeleted {
			t.Errorf("no object was created, yet the answer says desired %s", got.DesiredMode)
		}
		final, err := db.SandboxAnyOrg(ctx, got.ID)
		if err != nil {
			t.Fatal(err)
		}
		if final.DesiredMode == store.ModeDeleted && fc.Has(got.ID) {
			t.Errorf("%s: an object outlives its deleted record: %v", got.ID, calls)
		}
	}
}

// TestAttackCreateRefusedAnswer: a definite refusal answers an error, and
// the record is failed, not left pending for a client to wait on.
func TestAttackCreateRefusedAnswer(t *testing.T) {
	fc := &controltest.Cluster{CreateErr: apierrors.NewForbidden(schema.GroupResource{Resource: "sandboxes"}, "x", errors.New("admission webhook denied the request"))}
	c, db, org := newControl(t, fc)
	ctx := context.Background()
	sb, _, err := c.Create(ctx, liveCaller(t, db, org.ID), CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err == nil {
		t.Fatalf("a refused create answered %+v without an error", sb)
	}
	rec, rerr := db.SandboxAnyOrg(ctx, sb.ID)
	if rerr != nil || rec.State != store.StateFailed {
		t.Errorf("record after a refusal: %+v, %v; want failed", rec, rerr)
	}
}
