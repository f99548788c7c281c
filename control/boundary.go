package control

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hiloop/hiloop/cluster"
)

// ErrNotHardened: the cluster lacks part of the isolation boundary (see
// NotHardenedError); creates and starts are refused until it holds.
var ErrNotHardened = errors.New("the cluster is not hardened")

// NotHardenedError names the boundary objects that are missing or weakened.
type NotHardenedError struct{ Failed []cluster.Check }

func (e *NotHardenedError) Error() string {
	parts := make([]string, 0, len(e.Failed))
	for _, c := range e.Failed {
		parts = append(parts, c.Object+": "+c.Problem)
	}
	return "the cluster is not hardened: " + strings.Join(parts, "; ")
}
func (e *NotHardenedError) Unwrap() error { return ErrNotHardened }

// BoundaryReport is one run of the isolation self-check.
type BoundaryReport struct {
	At     time.Time       `json:"at"`
	Checks []cluster.Check `json:"checks"`
}

// Err is a NotHardenedError naming every failure the deployment does not
// allow, or nil.
func (r *BoundaryReport) Err() error {
	var failed []cluster.Check
	for _, c := range r.Checks {
		if c.Failed() {
			failed = append(failed, c)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &NotHardenedError{Failed: failed}
}

// CheckBoundary runs the self-check now and keeps its report, which admits
// or refuses creates and starts until the next run.
func (c *Control) CheckBoundary(ctx context.Context) *BoundaryReport {
	if c.o.Boundary == nil {
		return &BoundaryReport{At: c.o.Now()}
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.ClusterTimeout)
	defer cancel()
	r := &BoundaryReport{At: c.o.Now(), Checks: c.o.Boundary(ctx)}
	prev := c.boundary.Swap(r)
	for _, ch := range r.Checks {
		if ch.Name == cluster.CheckForeignSandboxes {
			c.foreign(ch, prev)
			continue
		}
		c.o.Metrics.SelfCheck(ch.Name, ch.Object, ch.OK, ch.Allowed)
	}
	err, was := r.Err(), error(nil)
	if prev != nil {
		was = prev.Err()
	}
	switch {
	case err != nil && (prev == nil || was == nil || err.Error() != was.Error()):
		c.log.Error("isolation self-check failed: creates and starts are refused (hiloop doctor says how to fix it)")
		for _, ch := range r.Checks {
			if ch.Failed() {
				c.log.Error("self-check", "object", ch.Object, "problem", ch.Problem, "detail", ch.Detail, "fix", ch.Fix)
			}
		}
	case err == nil && (prev == nil || was != nil):
		c.log.Info("isolation self-check passed", "checks", len(r.Checks))
	}
	return r
}

// Boundary is the latest self-check report, nil before the first.
func (c *Control) Boundary() *BoundaryReport { return c.boundary.Load() }

// Hardened is nil when the last self-check passed (or the core runs without
// one). Before the first check it fails closed.
func (c *Control) Hardened() error {
	if c.o.Boundary == nil {
		return nil
	}
	r := c.boundary.Load()
	if r == nil {
		return &NotHardenedError{Failed: []cluster.Check{{Object: "isolation self-check", Problem: "it has not run yet"}}}
	}
	return r.Err()
}

// foreign reports Sandboxes in the namespace that hiloop did not make: a
// gauge every run, and a log line when what is found changes. No record
// can say so: the product record holds only sandboxes an organization made
// through hiloop, and these belong to none.
func (c *Control) foreign(ch cluster.Check, prev *BoundaryReport) {
	c.o.Metrics.ForeignSandboxes(ch.Count)
	was := ""
	if prev != nil {
		for _, p := range prev.Checks {
			if p.Name == cluster.CheckForeignSandboxes {
				was = p.Problem
			}
		}
	}
	switch {
	case ch.Problem == was:
	case ch.Problem != "":
		c.log.Warn("sandbox namespace holds Sandboxes hiloop did not make; hiloop does not mirror or manage them",
			"count", ch.Count, "problem", ch.Problem, "detail", ch.Detail, "fix", ch.Fix)
	default:
		c.log.Info("sandbox namespace holds no Sandboxes hiloop did not make")
	}
}

// Boundary states, as /readyz names them.
const (
	BoundaryHardened    = "hardened"
	BoundaryNotHardened = "not_hardened"
	BoundaryInsecure    = "insecure"
)

// BoundaryState names the boundary's state alone, without objects, for
// answers anyone may read: not_hardened while creates and starts are
// refused (before the first check too), insecure while only failures the
// deployment allows remain (--insecure-no-gvisor), hardened otherwise.
func (c *Control) BoundaryState() string {
	if err := c.Hardened(); err != nil {
		return BoundaryNotHardened
	}
	if r := c.boundary.Load(); r != nil {
		for _, ch := range r.Checks {
			if !ch.OK && ch.Allowed {
				return BoundaryInsecure
			}
		}
	}
	return BoundaryHardened
}
