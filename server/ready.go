package server

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// readiness runs the readiness check for /readyz, one at a time: a request
// that arrives while a check runs waits for that check's answer instead of
// starting another. /readyz needs no key and is not held to the address
// limit, since the kubelet's probes can share an address with anyone
// behind the same NAT, so this is what bounds it: however many ask, at most
// one check (a record write, a call to the API server) is in flight, and a
// check that hangs holds one goroutine, not one per request.
type readiness struct {
	mu sync.Mutex
	// running is closed when the check in flight ends, with its answer in
	// err; nil when none is in flight.
	running chan struct{}
	err     error
}

// check answers whether the server is ready, within timeout, from the
// check in flight or a new one.
func (rd *readiness) check(ctx context.Context, ready func(context.Context) error, timeout time.Duration) error {
	rd.mu.Lock()
	done := rd.running
	if done == nil {
		done = make(chan struct{})
		rd.running = done
		go func() {
			cctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			err := ready(cctx)
			rd.mu.Lock()
			rd.err, rd.running = err, nil
			close(done)
			rd.mu.Unlock()
		}()
	}
	rd.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		rd.mu.Lock()
		defer rd.mu.Unlock()
		return rd.err
	case <-t.C:
	case <-ctx.Done():
	}
	return fmt.Errorf("readiness check did not answer within %s", timeout)
}
