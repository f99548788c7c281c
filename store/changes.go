package store

import "sync"

// changes wakes whoever waits for a sandbox's state to change: the API's
// long poll (GET /v1/sandboxes/{id}?while=STATE), so that a client learns of
// running when the mirror writes it, not at its next poll. Every state
// change is a transition the store records (insertEvent), and the
// transaction that records one wakes the sandbox's waiters once it commits
// (inTx).
type changes struct {
	mu      sync.Mutex
	waiting map[string]*waiters
}

// waiters share one channel per sandbox; n counts them, so the entry goes
// when the last stops waiting, whether or not a change came.
type waiters struct {
	ch chan struct{}
	n  int
}

// StateChange returns a channel that is closed at the next state change of
// sandbox id, and release, which the caller must call when it stops waiting.
// Take it before reading the record, so that a change between the read and
// the wait is not missed.
func (s *Store) StateChange(id string) (<-chan struct{}, func()) {
	c := &s.changes
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting == nil {
		c.waiting = map[string]*waiters{}
	}
	w := c.waiting[id]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		c.waiting[id] = w
	}
	w.n++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if w.n--; w.n == 0 && c.waiting[id] == w {
				delete(c.waiting, id)
			}
		})
	}
}

// stateChanged wakes everyone waiting for a state change of sandbox id.
// Those who wait again after it get a new channel.
func (c *changes) stateChanged(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.waiting[id]; w != nil {
		close(w.ch)
		delete(c.waiting, id)
	}
}

// Waiting is how many sandboxes someone waits on for a state change; it is
// back to zero once every waiter has released. It is exported for the tests
// of the packages that wait (control's WaitWhile, the server's long poll):
// they learn from it that a waiter is in place before they make the change
// it waits for, and that every waiter let go.
func (s *Store) Waiting() int {
	c := &s.changes
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting)
}
