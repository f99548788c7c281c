package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// TestCrashSafety kills `hiloop serve` with SIGKILL at random moments while
// four clients create, stop, start and delete, and restarts it on the same
// record each time. After every restart: each acknowledged create is in the
// record, each acknowledged delete is recorded, the file passes
// integrity_check, no record stays pending, and every Sandbox object that
// carries hiloop's labels has a record. HILOOP_CRASH_KILLS sets the number
// of kills (3 here; make soak runs 200).
func TestCrashSafety(t *testing.T) {
	kills := 3
	if v, err := strconv.Atoi(os.Getenv("HILOOP_CRASH_KILLS")); err == nil && v > 0 {
		kills = v
	}
	ns := e2e.NewNamespace(t)
	db := filepath.Join(t.TempDir(), "h.db")
	in := e2e.Serve(t, db, ns, "--rate-limit", "0", "--create-rate-limit", "0", "--org-rate-limit", "0", "--org-create-rate-limit", "0")
	token := in.NewOrg("crash", 100000, 100000)
	var mu sync.Mutex
	created, deleted := map[string]bool{}, map[string]bool{}
	start := time.Now()
	for k := range kills {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []string
				for {
					select {
					case <-stop:
						return
					default:
					}
					if len(mine) == 0 || rand.IntN(3) == 0 {
						status, body, err := call(in, token, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
						var sb e2e.Sandbox
						if err == nil && (status == 201 || status == 202) && json.Unmarshal([]byte(body), &sb) == nil {
							mu.Lock()
							created[sb.ID] = true
							mu.Unlock()
							mine = append(mine, sb.ID)
						}
						continue
					}
					id := mine[rand.IntN(len(mine))]
					switch rand.IntN(3) {
					case 0:
						call(in, token, "POST", "/v1/sandboxes/"+id+"/stop", "")
					case 1:
						call(in, token, "POST", "/v1/sandboxes/"+id+"/start", "")
					default:
						if status, _, err := call(in, token, "DELETE", "/v1/sandboxes/"+id, ""); err == nil && status == 200 {
							mu.Lock()
							deleted[id] = true
							mu.Unlock()
						}
					}
				}
			}()
		}
		time.Sleep(time.Duration(300+rand.IntN(1500)) * time.Millisecond)
		in.Signal(syscall.SIGKILL, 10*time.Second)
		close(stop)
		wg.Wait()
		if err := store.CheckIntegrity(context.Background(), db); err != nil {
			t.Fatalf("kill %d: %v", k, err)
		}
		in = e2e.Serve(t, db, ns, "--rate-limit", "0", "--create-rate-limit", "0", "--org-rate-limit", "0", "--org-create-rate-limit", "0")
		checkConverged(t, in, token, ns, created, deleted)
	}
	t.Logf("%d kills survived in %s: %d acknowledged creates, %d acknowledged deletes, nothing lost",
		kills, time.Since(start).Round(time.Second), len(created), len(deleted))
}

// call makes one request without failing the test: the server may be
// killed under it.
func call(in *e2e.Instance, token, method, path, body string) (int, string, error) {
	status, _, b, err := in.TryCall(token, method, path, body)
	return status, b, err
}

// checkConverged checks the record against what was acknowledged and the
// cluster against the record.
func checkConverged(t *testing.T, in *e2e.Instance, token, ns string, created, deleted map[string]bool) {
	t.Helper()
	for id := range created {
		sb := in.Get(token, id)
		if deleted[id] && sb.Desired != "deleted" {
			t.Fatalf("acknowledged delete of %s is not recorded (desired %s)", id, sb.Desired)
		}
	}
	eventually.Within(t, "no record pending", 90*time.Second, func() (bool, error) {
		for id := range created {
			if sb := in.Get(token, id); sb.State == "pending" {
				return false, fmt.Errorf("%s is still pending", id)
			}
		}
		return true, nil
	})
	objs, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).List(context.Background(), metav1.ListOptions{LabelSelector: k8s.Selector})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs.Items {
		id := o.Labels[k8s.LabelSandbox]
		if status, _ := in.Call(token, "GET", "/v1/sandboxes/"+id, ""); status != 200 {
			t.Fatalf("object %s has no record (GET %d)", o.Name, status)
		}
	}
}
