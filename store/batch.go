package store

import (
	"context"
	"errors"
	"sync/atomic"
)

// The writes every create and every observation make go through a group
// commit: one goroutine takes whatever writes are waiting, up to maxBatch,
// and runs them in one transaction, each in a savepoint of its own (opened
// by its first statement that writes). A write that fails (a quota, a
// conflict) rolls back to its savepoint and fails alone; the others commit
// together. A burst of 100 creates, or the mirror's observations of 100
// pods turning Ready, then costs a few transactions instead of 100 queued
// one behind the other on SQLite's one writer. A write alone runs at once,
// in a transaction of its own.

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

type batcher struct {
	reqs chan *batchReq
	stop chan struct{}
	done chan struct{}
	// waiting counts writes waiting for their batch; batches counts the
	// transactions (tests read both).
	waiting, batches atomic.Int64
}

type batchReq struct {
	ctx context.Context
	fn  func(ctx context.Context, tx *txn) error
	err chan error
}

func (s *Store) startBatches() {
	s.batch.reqs, s.batch.stop, s.batch.done = make(chan *batchReq), make(chan struct{}), make(chan struct{})
	go s.runBatches()
}

// stopBatches ends the group commit once the batch in hand is committed.
func (s *Store) stopBatches() {
	if s.batch.stop == nil {
		return
	}
	close(s.batch.stop)
	<-s.batch.done
	s.batch.stop = nil
}

// inBatch runs fn in a transaction shared with other writes waiting at the
// same time (see above), and returns once that transaction has committed or
// failed. fn's statements run with ctx's values but not its cancellation:
// an interrupted statement would roll back every write of the batch. A ctx
// already done when fn's turn comes skips fn.
func (s *Store) inBatch(ctx context.Context, fn func(ctx context.Context, tx *txn) error) error {
	r := &batchReq{ctx: ctx, fn: fn, err: make(chan error, 1)}
	s.batch.waiting.Add(1)
	defer s.batch.waiting.Add(-1)
	select {
	case s.batch.reqs <- r:
	case <-s.batch.done:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-r.err
}

func (s *Store) runBatches() {
	defer close(s.batch.done)
	for {
		var reqs []*batchReq
		select {
		case r := <-s.batch.reqs:
			reqs = append(reqs, r)
		case <-s.batch.stop:
			return
		}
	more:
		for len(reqs) < maxBatch {
			select {
			case r := <-s.batch.reqs:
				reqs = append(reqs, r)
			default:
				break more
			}
		}
		s.commitBatch(reqs)
	}
}

// commitBatch runs reqs in one transaction and answers each: its own error,
// or the transaction's when that failed.
func (s *Store) commitBatch(reqs []*batchReq) {
	bg := context.Background()
	s.batch.batches.Add(1)
	errs := make([]error, len(reqs))
	err := s.inTx(bg, func(tx *txn) error {
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
	for i, r := range reqs {
		if errs[i] == nil {
			errs[i] = err
		}
		r.err <- errs[i]
	}
}
