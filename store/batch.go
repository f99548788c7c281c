package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// The writes every create and every observation make go through a group
// commit: the writes that wait at the same time run in one transaction,
// up to maxBatch, each in a savepoint of its own (opened by its first
// statement that writes). A write that fails (a quota, a conflict) rolls
// back to its savepoint and fails alone; the others commit together. A
// burst of 100 creates, or the mirror's observations of 100 pods turning
// Ready, then costs a few transactions instead of 100 queued one behind the
// other on SQLite's one writer.
//
// The batches are committed by the writers themselves, not by a goroutine
// of the store's: a write that finds no batch under way leads, and commits
// with its own what waits once it holds the writer's connection; then it
// hands the lead to the first write still waiting, if any. A write alone
// then runs on its caller's goroutine, and a batch costs one hand-off
// between goroutines, not two per write (to a committing goroutine and
// back), which with the scheduler's wake-ups were a large part of serve's
// CPU while sandboxes were being created.

// Each write of a batch runs in a savepoint.
const (
	savepointSQL  = "SAVEPOINT w"
	rollbackToSQL = "ROLLBACK TO w"
	releaseSQL    = "RELEASE w"
)

// maxBatch bounds how many writes share a transaction.
const maxBatch = 64

// errClosed answers writes that arrive after Close.
var errClosed = errors.New("store closed")

// errLead tells a waiting write that it leads now (see above).
var errLead = errors.New("store: lead the next batch")

// errPanicked answers the writes of a batch whose transaction panicked.
var errPanicked = errors.New("store: a write of the batch panicked")

type batcher struct {
	mu sync.Mutex
	// queue holds the writes not yet taken into a batch, in order of
	// arrival; it is empty unless leading.
	queue []*batchReq
	// leading says a write leads: it commits batches, or hands the lead
	// on, until the queue is empty.
	leading bool
	closed  bool
	// led is signalled when the lead ends with nothing waiting.
	led sync.Cond
	// waiting counts writes waiting for their batch; batches counts the
	// transactions (tests read both).
	waiting, batches atomic.Int64
}

type batchReq struct {
	ctx context.Context
	fn  func(ctx context.Context, tx *txn) error
	// err answers the write, or tells it to lead (errLead) first.
	err chan error
}

func (s *Store) startBatches() { s.batch.led.L = &s.batch.mu }

// stopBatches refuses writes from now on and returns once the writes
// already waiting are committed.
func (s *Store) stopBatches() {
	b := &s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for b.leading {
		b.led.Wait()
	}
}

// inBatch runs fn in a transaction shared with other writes waiting at the
// same time (see above), and returns once that transaction has committed or
// failed. fn's statements run with ctx's values but not its cancellation:
// an interrupted statement would roll back every write of the batch. A ctx
// already done when fn's turn comes skips fn.
func (s *Store) inBatch(ctx context.Context, fn func(ctx context.Context, tx *txn) error) error {
	r := &batchReq{ctx: ctx, fn: fn, err: make(chan error, 1)}
	b := &s.batch
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return errClosed
	}
	b.queue = append(b.queue, r)
	lead := !b.leading
	b.leading = true
	b.mu.Unlock()
	if !lead {
		if err := <-r.err; err != errLead {
			return err
		}
	}
	// Leading, r is first in the queue, so the batch takes it.
	s.lead()
	return <-r.err
}

// lead commits one batch, the first of the queue, then hands the lead to
// the first write still waiting, or ends it.
func (s *Store) lead() {
	b := &s.batch
	var reqs []*batchReq
	answered := false
	defer func() {
		if answered {
			return
		}
		// fn panicked: the batch is rolled back; its writes fail and
		// the lead goes on, so that no write waits for ever.
		for _, r := range reqs {
			r.err <- errPanicked
		}
		s.passLead()
	}()
	errs, err := s.commitBatch(func() []*batchReq {
		b.mu.Lock()
		defer b.mu.Unlock()
		n := min(len(b.queue), maxBatch)
		reqs = append([]*batchReq(nil), b.queue[:n]...)
		b.queue = append(b.queue[:0], b.queue[n:]...)
		return reqs
	})
	for i, r := range reqs {
		if errs[i] == nil {
			errs[i] = err
		}
		r.err <- errs[i]
	}
	answered = true
	s.passLead()
}

// passLead hands the lead to the first write waiting, or ends it.
func (s *Store) passLead() {
	b := &s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.leading = false
		b.led.Broadcast()
		return
	}
	b.queue[0].err <- errLead
}

// commitBatch runs, in one transaction, the writes take gives it once the
// transaction has begun (those waiting then, so that the ones that came
// while it waited for the writer's connection are in it), and returns
// each one's error and the transaction's.
func (s *Store) commitBatch(take func() []*batchReq) ([]error, error) {
	bg := context.Background()
	s.batch.batches.Add(1)
	var errs []error
	err := s.inTx(bg, func(tx *txn) error {
		reqs := take()
		errs = make([]error, len(reqs))
		if len(reqs) == 1 { // alone, it needs no savepoint
			if errs[0] = reqs[0].ctx.Err(); errs[0] == nil {
				errs[0] = reqs[0].fn(context.WithoutCancel(reqs[0].ctx), tx)
			}
			return errs[0]
		}
		defer func() { tx.savepoint = false }()
		for i, r := range reqs {
			if errs[i] = r.ctx.Err(); errs[i] != nil {
				continue
			}
			// The write's savepoint opens with its first statement that
			// writes (txn.ExecContext); one that wrote nothing has none.
			tx.savepoint, tx.opened = true, false
			woken := len(tx.transitions)
			errs[i] = r.fn(context.WithoutCancel(r.ctx), tx)
			if !tx.opened {
				continue
			}
			if errs[i] != nil {
				if _, err := tx.exec(bg, rollbackToSQL); err != nil {
					return err
				}
				tx.transitions = tx.transitions[:woken] // rolled back: no change to wake
			}
			if _, err := tx.exec(bg, releaseSQL); err != nil {
				return err
			}
		}
		return nil
	})
	if errs == nil { // the transaction did not begin
		errs = make([]error, len(take()))
	}
	return errs, err
}
