package server

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/hiloop/hiloop/control/controltest"
)

// BenchmarkCreateBurst is the API's side of a burst of creates, 100 at
// once, against a cluster that answers at once: what serve spends from a
// POST's arrival to its answer, without the API server it would wait on.
func BenchmarkCreateBurst(b *testing.B) {
	const n = 100
	ts := newTestServer(b, &controltest.Cluster{})
	if err := ts.db.SetQuota(context.Background(), ts.org.ID, 1_000_000, 1_000_000); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`); rec.Code != http.StatusCreated {
					b.Errorf("create: %d %s", rec.Code, rec.Body)
				}
			})
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/create")
}
