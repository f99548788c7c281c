package sshd

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestStartupsWaitChance: below start nobody waits; from start the chance
// grows from rate linearly to certain at full, as sshd's random early
// drop does.
func TestStartupsWaitChance(t *testing.T) {
	s := Startups{Start: 10, Rate: 30, Full: 110}
	for n, want := range map[int]float64{0: 0, 9: 0, 10: 0.3, 60: 0.65, 109: 0.993, 110: 1, 500: 1} {
		if got := s.waitChance(n); got < want-1e-9 || got > want+1e-9 {
			t.Errorf("waitChance(%d) = %v, want %v", n, got, want)
		}
	}
	if got := (Startups{Start: 4, Rate: 100, Full: 4}).waitChance(4); got != 1 {
		t.Errorf("a hard cap: waitChance at it = %v, want 1", got)
	}
}

// TestPenaltyCharges: charges add up and run down in real time; an
// address is refused once it was charged the minimum since it last owed
// nothing, until it owes nothing; it never owes more than the maximum;
// and the table of addresses is bounded, expired entries going first.
func TestPenaltyCharges(t *testing.T) {
	o := Penalties{AuthFail: 5 * time.Second, Min: 15 * time.Second, Max: time.Minute, MaxSources: 2}
	var l limits
	now := time.Unix(1000, 0)
	type state struct {
		Left      time.Duration
		Penalised bool
	}
	check := func(what, src string, at time.Time, want state) {
		t.Helper()
		left, ok := l.penalised(src, at)
		if diff := cmp.Diff(want, state{left, ok}); diff != "" {
			t.Errorf("%s (-want +got):\n%s", what, diff)
		}
	}
	l.charge(&o, "a", 5*time.Second, now)
	l.charge(&o, "a", 5*time.Second, now.Add(2*time.Second))
	check("two failures", "a", now.Add(2*time.Second), state{8 * time.Second, false})
	if !l.charge(&o, "a", 5*time.Second, now.Add(3*time.Second)) {
		t.Error("the third failure did not penalise the address")
	}
	check("three failures", "a", now.Add(3*time.Second), state{12 * time.Second, true})
	check("once it owes nothing", "a", now.Add(15*time.Second), state{0, false})
	// Charges far apart run out in between and never add up.
	for i := range 10 {
		l.charge(&o, "b", 5*time.Second, now.Add(time.Duration(i)*6*time.Second))
	}
	check("failures far apart", "b", now.Add(54*time.Second), state{5 * time.Second, false})
	for range 100 {
		l.charge(&o, "c", 5*time.Second, now)
	}
	check("at most the maximum", "c", now, state{time.Minute, true})
	// The table holds b and c; d is not tracked until an entry expires.
	l.charge(&o, "d", time.Hour, now.Add(55*time.Second))
	check("past max-sources", "d", now.Add(55*time.Second), state{0, false})
	l.charge(&o, "d", 20*time.Second, now.Add(61*time.Second))
	check("once an entry expired", "d", now.Add(61*time.Second), state{20 * time.Second, true})
}

// TestParseLimits: the flags' text forms.
func TestParseLimits(t *testing.T) {
	var s Startups
	if err := s.UnmarshalText([]byte("10:30:100")); err != nil || s != (Startups{10, 30, 100}) {
		t.Errorf("10:30:100: %+v %v", s, err)
	}
	if err := s.UnmarshalText([]byte("7")); err != nil || s != (Startups{7, 100, 7}) {
		t.Errorf("7: %+v %v", s, err)
	}
	for _, bad := range []string{"", "0", "10:30", "10:0:100", "10:101:100", "10:30:5", "x:y:z"} {
		if err := s.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	var p Penalties
	if err := p.UnmarshalText([]byte("crash:1m,min:20s")); err != nil {
		t.Fatal(err)
	}
	want := defaultPenalties()
	want.Crash, want.Min = time.Minute, 20*time.Second
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("crash:1m,min:20s over the defaults (-want +got):\n%s", diff)
	}
	if err := p.UnmarshalText([]byte("off")); err != nil || !p.Off {
		t.Errorf("off: %+v %v", p, err)
	}
	for _, bad := range []string{"crash", "crash:x", "nope:1s", "min:0s", "max:1s", "max-sources:0", "authfail:-1s"} {
		if err := p.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
