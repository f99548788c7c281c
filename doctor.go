package main

import (
	"context"
	"fmt"
	"io"

	"github.com/hiloop/hiloop/app"
	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
)

// DoctorCmd checks the cluster the way serve's self-check does, and what
// serve's account may not read: whether the sandboxes' egress reaches the
// API server or a node. It prints every check with the fix for each
// failure.
type DoctorCmd struct {
	app.ClusterFlags `embed:""`
}

// Validate checks the flags.
func (d *DoctorCmd) Validate() error { return d.ClusterFlags.Check() }

// errChecksFailed makes doctor exit 1 after it printed its report.
type errChecksFailed int

func (e errChecksFailed) Error() string { return fmt.Sprintf("%d checks failed", int(e)) }

// Run prints one line per check: ok, FAIL (with the fix), allowed (a
// failure --insecure-no-gvisor accepts) or warn (reported, refuses
// nothing).
func (d *DoctorCmd) Run(ctx context.Context, stdout io.Writer) error {
	clients, err := d.Clients(ctx)
	if err != nil {
		fmt.Fprintf(stdout, "FAIL    cluster: %v\n        fix: pass --kubeconfig, or check that the API server answers\n", err)
		return errChecksFailed(1)
	}
	checks := []cluster.Check{{Name: "cluster", Object: "API server " + clients.Config.Host, OK: true}}
	sctx, cancel := context.WithTimeout(ctx, d.ClusterTimeout)
	err = clients.CheckSandboxAPI(sctx)
	cancel()
	api := cluster.Check{Name: "sandbox_api", Object: "Sandbox API " + k8s.SandboxGroup + "/" + k8s.SandboxVersion, OK: err == nil}
	if err != nil {
		api.Problem, api.Fix = err.Error(), "install the agent-sandbox CRD and controller (the chart does, unless agent-sandbox.enabled=false)"
	}
	checks = append(checks, api)
	bctx, cancel := context.WithTimeout(ctx, d.ClusterTimeout)
	checks = append(checks, boundary.Check(bctx, clients, d.BoundaryOptions())...)
	cancel()
	ectx, cancel := context.WithTimeout(ctx, d.ClusterTimeout)
	checks = append(checks, boundary.CheckEgress(ectx, clients, d.Namespace))
	cancel()
	failed := 0
	for _, c := range checks {
		switch {
		case c.OK:
			fmt.Fprintf(stdout, "ok      %s\n", c.Object)
			continue
		case c.Allowed:
			fmt.Fprintf(stdout, "allowed %s: %s\n", c.Object, c.Problem)
		case c.Warning:
			fmt.Fprintf(stdout, "warn    %s: %s\n", c.Object, c.Problem)
		default:
			failed++
			fmt.Fprintf(stdout, "FAIL    %s: %s\n", c.Object, c.Problem)
		}
		if c.Detail != "" {
			fmt.Fprintf(stdout, "        cluster said: %s\n", c.Detail)
		}
		fmt.Fprintf(stdout, "        fix: %s\n", c.Fix)
	}
	if failed > 0 {
		fmt.Fprintf(stdout, "\n%d of %d checks failed: hiloop serve refuses creates and starts until they pass (the egress check is doctor's own).\n", failed, len(checks))
		return errChecksFailed(failed)
	}
	fmt.Fprintf(stdout, "\nall %d checks pass.\n", len(checks))
	return nil
}
