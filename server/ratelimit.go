package server

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
)

// RateLimits bound how fast callers may call. Zero rates turn a limit off.
//
// Limits per key alone can be multiplied: any key may make keys, and each
// new key would come with full buckets. So every request of a key also
// counts against its organization's buckets, which all its keys share, and
// the number of keys an organization may have is bounded in the core
// (control.Limits). Requests that carry no valid key are limited per client
// address before their token is looked up, and such tokens never get
// buckets of their own, so made-up tokens cannot crowd out a real key's.
type RateLimits struct {
	// PerKey is requests per second for every request of a key, with Burst.
	PerKey rate.Limit
	Burst  int
	// Creates is sandbox creates per second for a key, with CreateBurst.
	Creates     rate.Limit
	CreateBurst int
	// PerOrg and OrgCreates are the same over all of one organization's
	// keys together, with OrgBurst and OrgCreateBurst.
	PerOrg         rate.Limit
	OrgBurst       int
	OrgCreates     rate.Limit
	OrgCreateBurst int
	// PerAddress is requests per second, with AddressBurst, from one client
	// address (an IPv4 address, or an IPv6 /64) that carry no valid key: a
	// missing, unknown or revoked token, and the endpoints that need no key
	// but the kubelet's probes (see the probe access of routes).
	PerAddress   rate.Limit
	AddressBurst int
	// WaitsPerKey is how many long polls of one key, and of one
	// organization's keys together, wait at once; DefaultWaitsPerKey when
	// zero.
	WaitsPerKey int
}

// waits is the long polls one key may have waiting at once.
func (l RateLimits) waits() int {
	if l.WaitsPerKey == 0 {
		return DefaultWaitsPerKey
	}
	return l.WaitsPerKey
}

// bucket is the rate buckets and slots of one key, one organization or one
// client address (which has no creates, reads or waits).
type bucket struct {
	all, creates *rate.Limiter
	// reads bounds reads in flight (see readsInFlight); waits long polls
	// (see DefaultWaitsPerKey).
	reads, waits chan struct{}
	used         time.Time
	// limited counts refusals since reported, when the last summary line
	// for this bucket was logged.
	limited  int
	reported time.Time
	// org is a key's organization; empty for the others.
	org string
}

// table holds buckets by id. Entries idle for idleAfter are dropped once
// there are more than max (looked for at most once a second), and when
// none is idle, arbitrary ones are, so the table stays bounded; max 0
// drops only idle entries.
type table struct {
	m     map[string]*bucket
	max   int
	swept time.Time
}

func (t *table) add(id string, b *bucket, now time.Time) {
	if t.m == nil {
		t.m = map[string]*bucket{}
	}
	if t.max > 0 && len(t.m) >= t.max || now.Sub(t.swept) >= idleAfter {
		t.makeRoom(now)
	}
	t.m[id] = b
}

// makeRoom drops idle entries, at most once a second, and then arbitrary
// ones while the table is full.
func (t *table) makeRoom(now time.Time) {
	if now.Sub(t.swept) >= time.Second {
		t.swept = now
		for id, e := range t.m {
			if now.Sub(e.used) > idleAfter {
				delete(t.m, id)
			}
		}
	}
	for id := range t.m {
		if t.max == 0 || len(t.m) < t.max {
			return
		}
		delete(t.m, id) // map order is random
	}
}

// limiters holds the buckets of keys, organizations and client addresses.
//
// A key gets buckets only once it has authenticated, so the keys table holds
// real keys alone, bounded by the organizations and their key limit; the
// organizations table is bounded by the organizations, and its entries go
// only when idle, so an organization's buckets are never reset while its
// keys are busy; the addresses table is bounded by maxLimiters.
type limiters struct {
	mu                sync.Mutex
	keys, orgs, addrs table
	initialized       bool
}

func (l *limiters) init() {
	if !l.initialized {
		l.keys.max, l.addrs.max, l.initialized = maxLimiters, maxLimiters, true
	}
}

// reportEvery is how often a bucket's refusals are summed up in one log
// line. Refused requests get no access-log line each: under a flood that
// would turn every cheap refusal into a log write, and fill the operator's
// disk.
const reportEvery = 10 * time.Second

const (
	maxLimiters = 4096
	idleAfter   = 10 * time.Minute
)

// readsInFlight is how many GETs of one key run at once; more wait their
// turn. A key's burst from many connections then queues behind itself and
// leaves the CPU to other keys' requests. orgReadsInFlight bounds the
// same for all of an organization's keys together. Exec streams and writes
// are not counted: sessions have their own limits, and writes hold
// per-sandbox locks and the create rate.
const (
	readsInFlight    = 4
	orgReadsInFlight = 4 * readsInFlight
)

// DefaultWaitsPerKey is how many long polls (GET /v1/sandboxes/{id}?while=)
// of one key, and of one organization's keys together, wait at once. A long
// poll holds no read slot: it would hold it for up to a minute, and four of
// them would stall every other read of the key. Waiting costs a goroutine
// and a connection, and no CPU until the state changes; past this many, a
// long poll answers at once, as a plain GET does, and the client asks again.
const DefaultWaitsPerKey = 1024

// keyAndOrg are a key's buckets and its organization's; nil when the key has
// none.
func (l *limiters) keyAndOrg(keyHash string) (key, org *bucket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key = l.keys.m[keyHash]
	if key == nil {
		return nil, nil
	}
	return key, l.orgs.m[key.org]
}

// read waits for one of the key's read slots and one of its
// organization's, or for ctx; release gives them back.
func (l *limiters) read(ctx context.Context, keyHash string) (release func(), err error) {
	key, org := l.keyAndOrg(keyHash)
	var taken []chan struct{}
	release = func() {
		for _, c := range taken {
			<-c
		}
	}
	for _, b := range []*bucket{key, org} {
		if b == nil {
			continue
		}
		select {
		case b.reads <- struct{}{}:
			taken = append(taken, b.reads)
		case <-ctx.Done():
			release()
			return nil, ctx.Err()
		}
	}
	return release, nil
}

// wait takes one of the key's long-poll slots and one of its
// organization's if both are free; ok is false when one is not.
func (l *limiters) wait(keyHash string) (release func(), ok bool) {
	key, org := l.keyAndOrg(keyHash)
	var taken []chan struct{}
	release = func() {
		for _, c := range taken {
			<-c
		}
	}
	for _, b := range []*bucket{key, org} {
		if b == nil {
			continue
		}
		select {
		case b.waits <- struct{}{}:
			taken = append(taken, b.waits)
		default:
			release()
			return func() {}, false
		}
	}
	return release, true
}

// Whose limit refused a request.
const (
	scopeKey     = "key"
	scopeOrg     = "organization"
	scopeAddress = "address"
)

// refusal says how to refuse one request.
type refusal struct {
	// retry is how long until the caller may retry; hold how long to hold
	// the answer back (see rateLimited).
	retry, hold time.Duration
	// report is the number of refusals to log now, in one line, at most
	// once per reportEvery for a bucket; logAttrs name the bucket.
	report   int
	logAttrs []any
	// scope is whose limit it was.
	scope string
}

// refuse makes the refusal of a request that must wait d, counted against
// b, whose summary line is named by attrs.
func refuse(b *bucket, now time.Time, d time.Duration, scope string, attrs ...any) refusal {
	b.limited++
	no := refusal{retry: d, hold: min(max(d, minHold), maxHold), scope: scope, logAttrs: attrs}
	if b.limited > floodAfter {
		no.hold = maxHold
	}
	if now.Sub(b.reported) >= reportEvery {
		no.report, b.limited, b.reported = b.limited, 0, now
	}
	return no
}

// on reports whether a limiter limits anything.
func on(b *rate.Limiter) bool {
	return b != nil && b.Limit() != 0 && b.Limit() != rate.Inf
}

// allowKey takes a token of the key's buckets and its organization's for
// one request (and its create, if it is one), or says how to refuse it.
// found is false when the key has no buckets: it has not authenticated
// (yet, or since its entry went), and the caller checks its address and
// looks it up first.
func (l *limiters) allowKey(lim RateLimits, keyHash string, create bool) (found, ok bool, no refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	now := time.Now()
	key := l.keys.m[keyHash]
	if key == nil {
		return false, false, refusal{}
	}
	org := l.orgs.m[key.org]
	if org == nil {
		org = &bucket{all: rate.NewLimiter(lim.PerOrg, lim.OrgBurst), creates: rate.NewLimiter(lim.OrgCreates, lim.OrgCreateBurst),
			reads: make(chan struct{}, orgReadsInFlight), waits: make(chan struct{}, lim.waits())}
		l.orgs.add(key.org, org, now)
	}
	key.used, org.used = now, now
	type step struct {
		b     *rate.Limiter
		scope string
	}
	steps := []step{{key.all, scopeKey}, {org.all, scopeOrg}}
	if create {
		steps = append(steps, step{key.creates, scopeKey}, step{org.creates, scopeOrg})
	}
	var taken []*rate.Reservation
	for _, s := range steps {
		if !on(s.b) {
			continue
		}
		r := s.b.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			for _, t := range taken {
				t.CancelAt(now)
			}
			return true, false, refuse(key, now, d, s.scope, "key_fingerprint", keyHash[:12], "org", key.org)
		}
		taken = append(taken, r)
	}
	return true, true, refusal{}
}

// addKey gives a key that has just authenticated its buckets, unless it
// has them already.
func (l *limiters) addKey(lim RateLimits, keyHash, orgID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	if l.keys.m[keyHash] != nil {
		return
	}
	now := time.Now()
	l.keys.add(keyHash, &bucket{all: rate.NewLimiter(lim.PerKey, lim.Burst), creates: rate.NewLimiter(lim.Creates, lim.CreateBurst),
		reads: make(chan struct{}, readsInFlight), waits: make(chan struct{}, lim.waits()), used: now, org: orgID}, now)
}

// forget drops a key's buckets: it no longer authenticates (revoked).
func (l *limiters) forget(keyHash string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.keys.m, keyHash)
}

// address is the address's bucket, made if need be; l.mu is held.
func (l *limiters) address(lim RateLimits, addr string, now time.Time) *bucket {
	l.init()
	b := l.addrs.m[addr]
	if b == nil {
		b = &bucket{all: rate.NewLimiter(lim.PerAddress, lim.AddressBurst)}
		l.addrs.add(addr, b, now)
	}
	b.used = now
	return b
}

// allowAddress takes a token of the client address's bucket for a request
// without a key, or says how to refuse it.
func (l *limiters) allowAddress(lim RateLimits, addr string) (ok bool, no refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	b := l.address(lim, addr, now)
	if !on(b.all) {
		return true, refusal{}
	}
	r := b.all.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, refuse(b, now, d, scopeAddress, "address", addr)
	}
	return true, refusal{}
}

// takeAddress takes a token of the client address's bucket for a token
// that has no buckets, before it is looked up, or says how to refuse it;
// refund gives the token back once the token turns out to be a real key,
// so a real key's first request costs its address nothing. Each lookup of
// a made-up token is paid for before it is made, however many run at once.
func (l *limiters) takeAddress(lim RateLimits, addr string) (ok bool, no refusal, refund func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	b := l.address(lim, addr, now)
	if !on(b.all) {
		return true, refusal{}, func() {}
	}
	r := b.all.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, refuse(b, now, d, scopeAddress, "address", addr), nil
	}
	return true, refusal{}, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		r.CancelAt(time.Now())
	}
}

// chargeAddress takes a token of the client address's bucket, into debt if
// need be, for a key that had buckets and no longer authenticates (it was
// revoked): its lookup was not paid for by takeAddress.
func (l *limiters) chargeAddress(lim RateLimits, addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if b := l.address(lim, addr, now); on(b.all) {
		b.all.ReserveN(now, 1)
	}
}

// clientAddress is the address a request's client is counted under
// (control.Source), from the connection: headers such as X-Forwarded-For
// are not trusted, since any client can write them.
func clientAddress(r *http.Request) string { return control.Source(r.RemoteAddr) }

// A refusal is held back until the caller may retry, at least minHold, and
// maxHold once its bucket has been refused floodAfter times since its last
// summary line; at most maxHeld refusals are held at once (beyond that they
// are answered at once). A client that retries as soon as it is answered,
// as a runaway loop does, is paced by the answers themselves and cannot
// spin the server's CPU against other callers. Holding costs a parked
// goroutine.
const (
	minHold    = 100 * time.Millisecond
	maxHold    = time.Second
	floodAfter = 100
	maxHeld    = 1024
)

// rateLimited answers 429 rate_limited, once the hold is over, with
// Retry-After in whole seconds of what remains to wait. The answer gets no
// access-log line of its own; every reportEvery a bucket's refusals are
// logged as one line, a key's named by a fingerprint of the presented
// secret (the key is not looked up for a refused request).
func (s *Server) rateLimited(w http.ResponseWriter, r *http.Request, no refusal) {
	ri := info(r)
	ri.quiet = true
	if no.report > 0 {
		s.log.Warn("rate limited", append(no.logAttrs, "limit", no.scope, "refused", no.report, "since_s", reportEvery.Seconds(), "last_request_id", ri.id)...)
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
	msg := "too many requests with this key"
	switch no.scope {
	case scopeOrg:
		msg = "too many requests from your organization's keys together"
	case scopeAddress:
		msg = "too many requests without a valid key from this address"
	}
	d := api.ErrorDetail{Code: api.CodeRateLimited, Message: msg + "; retry after " + max(retry, 0).Round(time.Millisecond).String(), RequestID: ri.id}
	writeJSON(w, http.StatusTooManyRequests, api.ErrorBody{Error: d})
}
