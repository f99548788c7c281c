package server

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimits bound how fast one API key may call. Zero rates turn a limit
// off.
type RateLimits struct {
	// PerKey is requests per second for every request of a key, with Burst.
	PerKey rate.Limit
	Burst  int
	// Creates is sandbox creates per second for a key, with CreateBurst.
	Creates     rate.Limit
	CreateBurst int
	// WaitsPerKey is how many long polls of one key wait at once;
	// DefaultWaitsPerKey when zero.
	WaitsPerKey int
}

// waits is the long polls one key may have waiting at once.
func (l RateLimits) waits() int {
	if l.WaitsPerKey == 0 {
		return DefaultWaitsPerKey
	}
	return l.WaitsPerKey
}

// limiters holds each key's buckets. Entries idle for idleAfter are dropped
// once there are more than maxLimiters, so the map stays bounded by the keys
// in use.
type limiters struct {
	mu    sync.Mutex
	m     map[string]*keyLimiter
	swept time.Time
}

type keyLimiter struct {
	all, creates *rate.Limiter
	// reads bounds the key's reads in flight (see readsInFlight); waits
	// its long polls (see DefaultWaitsPerKey).
	reads, waits chan struct{}
	used         time.Time
	// limited counts refusals since reported, when the last summary line
	// for this key was logged.
	limited  int
	reported time.Time
}

// reportEvery is how often a key's refusals are summed up in one log line.
// Refused requests get no access-log line each: under a flood that would
// turn every cheap refusal into a log write, and fill the operator's disk.
const reportEvery = 10 * time.Second

const (
	maxLimiters = 4096
	idleAfter   = 10 * time.Minute
)

// readsInFlight is how many GETs of one key run at once; more wait their
// turn. A key's burst from many connections then queues behind itself and
// leaves the CPU to other keys' requests. Exec streams and writes are not
// counted: sessions have their own limits, and writes hold per-sandbox
// locks and the create rate.
const readsInFlight = 4

// read waits for one of the key's read slots, or for ctx; release gives it
// back.
func (l *limiters) read(ctx context.Context, keyID string) (release func(), err error) {
	k := l.get(keyID)
	if k == nil {
		return func() {}, nil
	}
	select {
	case k.reads <- struct{}{}:
		return func() { <-k.reads }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// get is the key's limiter; allow made it, so it is nil only in a test
// without limits.
func (l *limiters) get(keyID string) *keyLimiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[keyID]
}

// DefaultWaitsPerKey is how many long polls (GET /v1/sandboxes/{id}?while=)
// of one key wait at once. A long poll holds no read slot: it would hold it for
// up to a minute, and four of them would stall every other read of the key.
// Waiting costs a goroutine and a connection, and no CPU until the state
// changes; past this many, a long poll answers at once, as a plain GET does,
// and the client asks again.
const DefaultWaitsPerKey = 1024

// wait takes one of the key's long-poll slots if one is free; ok is false
// when none is.
func (l *limiters) wait(keyID string) (release func(), ok bool) {
	k := l.get(keyID)
	if k == nil {
		return func() {}, true
	}
	select {
	case k.waits <- struct{}{}:
		return func() { <-k.waits }, true
	default:
		return func() {}, false
	}
}

// makeRoom keeps the map bounded when it is full: idle entries go (looked
// for at most once a second), and when none is idle, a few arbitrary ones
// do. A flood of made-up secrets, each getting an entry before the record
// says it is unknown, then costs bounded memory and time; an evicted key
// starts again with a full bucket.
func (l *limiters) makeRoom(now time.Time) {
	if now.Sub(l.swept) >= time.Second {
		l.swept = now
		for id, e := range l.m {
			if now.Sub(e.used) > idleAfter {
				delete(l.m, id)
			}
		}
	}
	for id := range l.m {
		if len(l.m) < maxLimiters {
			return
		}
		delete(l.m, id) // map order is random
	}
}

// refusal says how to refuse one request.
type refusal struct {
	// retry is how long until the key may retry; hold how long to hold the
	// answer back (see rateLimited).
	retry, hold time.Duration
	// report is the number of refusals to log now, in one line, at most
	// once per reportEvery for a key.
	report int
}

// allow takes a token for the key's request (and its create, if it is one),
// or says how to refuse it.
func (l *limiters) allow(lim RateLimits, keyID string, create bool) (ok bool, no refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.m == nil {
		l.m = map[string]*keyLimiter{}
	}
	k := l.m[keyID]
	if k == nil {
		if len(l.m) >= maxLimiters {
			l.makeRoom(now)
		}
		k = &keyLimiter{all: rate.NewLimiter(lim.PerKey, lim.Burst), creates: rate.NewLimiter(lim.Creates, lim.CreateBurst),
			reads: make(chan struct{}, readsInFlight), waits: make(chan struct{}, lim.waits())}
		l.m[keyID] = k
	}
	k.used = now
	for _, b := range []*rate.Limiter{k.all, k.creates} {
		if b == k.creates && !create {
			continue
		}
		if b.Limit() == 0 || b.Limit() == rate.Inf {
			continue
		}
		r := b.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			k.limited++
			no = refusal{retry: d, hold: min(max(d, minHold), maxHold)}
			if k.limited > floodAfter {
				no.hold = maxHold
			}
			if now.Sub(k.reported) >= reportEvery {
				no.report, k.limited, k.reported = k.limited, 0, now
			}
			return false, no
		}
	}
	return true, refusal{}
}

// A refusal is held back until the key may retry, at least minHold, and
// maxHold once the key has been refused floodAfter times since its last
// summary line; at most maxHeld refusals are held at once (beyond that they
// are answered at once). A client that retries as soon as it is answered,
// as a runaway loop does, is paced by the answers themselves and cannot
// spin the server's CPU against other keys. Holding costs a parked
// goroutine.
const (
	minHold    = 100 * time.Millisecond
	maxHold    = time.Second
	floodAfter = 100
	maxHeld    = 1024
)

// rateLimited answers 429 rate_limited, once the hold is over, with
// Retry-After in whole seconds of what remains to wait. The answer gets no
// access-log line of its own; every reportEvery a key's refusals are logged
// as one line, named by a fingerprint of the presented secret (the key is
// not looked up for a refused request).
func (s *Server) rateLimited(w http.ResponseWriter, r *http.Request, keyHash string, no refusal) {
	ri := info(r)
	ri.quiet = true
	if no.report > 0 {
		s.log.Warn("rate limited", "key_fingerprint", keyHash[:12], "refused", no.report, "since_s", reportEvery.Seconds(), "last_request_id", ri.id)
	}
	retry := no.retry
	select {
	case s.held <- struct{}{}:
		hold := no.hold
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		<-s.held
		retry -= hold
	default:
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(retry, 0).Seconds()))))
	d := ErrorDetail{Code: CodeRateLimited, Message: "too many requests with this key; retry after " + retry.Round(time.Millisecond).String(), RequestID: ri.id}
	writeJSON(w, http.StatusTooManyRequests, ErrorBody{Error: d})
}
