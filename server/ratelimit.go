package server

import (
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
}

// limiters holds each key's buckets. Entries idle for idleAfter are dropped
// once there are more than maxLimiters, so the map stays bounded by the keys
// in use.
type limiters struct {
	mu sync.Mutex
	m  map[string]*keyLimiter
}

type keyLimiter struct {
	all, creates *rate.Limiter
	used         time.Time
}

const (
	maxLimiters = 4096
	idleAfter   = 10 * time.Minute
)

// allow takes a token for the key's request (and its create, if it is one)
// and says how long to wait when there is none.
func (l *limiters) allow(lim RateLimits, keyID string, create bool) (ok bool, retry time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.m == nil {
		l.m = map[string]*keyLimiter{}
	}
	k := l.m[keyID]
	if k == nil {
		if len(l.m) >= maxLimiters {
			for id, e := range l.m {
				if now.Sub(e.used) > idleAfter {
					delete(l.m, id)
				}
			}
		}
		k = &keyLimiter{all: rate.NewLimiter(lim.PerKey, lim.Burst), creates: rate.NewLimiter(lim.Creates, lim.CreateBurst)}
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
			return false, d
		}
	}
	return true, 0
}

// rateLimited answers 429 rate_limited with Retry-After in whole seconds.
func (s *Server) rateLimited(w http.ResponseWriter, r *http.Request, retry time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	s.writeError(w, r, newError(http.StatusTooManyRequests, CodeRateLimited, "too many requests with this key; retry after "+retry.Round(time.Millisecond).String()))
}
