package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/alecthomas/kong"
	gossh "golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"

	"github.com/hiloop/hiloop/app"
	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/localcluster"
	"github.com/hiloop/hiloop/receipt"
)

// tuneGC: every packet of an SSH session or forward allocates in x/crypto,
// and the default GC target spends much of a forward's CPU collecting
// (BenchmarkForwardThroughput; docs/benchmarks.md has the figures).
// serve's live heap is small (the mirror's caches, a few KB a sandbox), so
// it collects at 400%, under a soft memory limit of three quarters of its
// container's memory limit when it has one. GOGC and GOMEMLIMIT in the
// environment win.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		if limit := cgroupMemoryLimit("/sys/fs/cgroup"); limit > 0 {
			debug.SetMemoryLimit(limit / 4 * 3)
		}
	}
}

// cgroupMemoryLimit reads the memory limit of the cgroup mounted at root
// (v2's memory.max, else v1's memory.limit_in_bytes); 0 when there is none.
func cgroupMemoryLimit(root string) int64 {
	for _, f := range []string{"memory.max", "memory/memory.limit_in_bytes"} {
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		// "max", or v1's "no limit" (a page-rounded huge number).
		if err != nil || v <= 0 || v >= 1<<62 {
			return 0
		}
		return v
	}
	return 0
}

// ServeCmd runs the control plane: app.Config's flags, and where to say
// which addresses it bound.
type ServeCmd struct {
	app.Config `embed:""`
	AddrFile   string `name:"addr-file" default:"" env:"HILOOP_ADDR_FILE" help:"File serve writes, once every listener is bound and before it serves, with the addresses it bound as one JSON object: {\"api\": \"host:port\", \"ssh\": \"host:port\", \"metrics\": \"host:port\"} (ssh and metrics only when on), for a program that starts serve on port 0 (docs/operations.md)."`
}

// Validate checks the flags; kong reports a failure naming the flag, exit 2.
func (s *ServeCmd) Validate() error { return s.Config.Check() }

// Run serves until ctx (SIGINT or SIGTERM) ends.
func (s *ServeCmd) Run(ctx context.Context, stdout io.Writer) error {
	tuneGC()
	return s.serve(ctx, stdout, nil)
}

// serve builds hiloop, says where it listens, and runs it until ctx ends;
// extra runs beside it (app.Options.Extra).
func (s *ServeCmd) serve(ctx context.Context, stdout io.Writer, extra func(context.Context, *slog.Logger) error) error {
	a, err := app.New(ctx, app.Options{Config: s.Config, Log: newLogger(s.LogLevel, s.LogFormat), Stdout: stdout, Extra: extra})
	if err != nil {
		return err
	}
	addrs := a.Addrs()
	if addrs.SSH != "" {
		fmt.Fprintf(stdout, "hiloop ssh gateway on %s (host key %s)\n", addrs.SSH, gossh.FingerprintSHA256(a.HostKey()))
	}
	if addrs.Metrics != "" {
		fmt.Fprintf(stdout, "hiloop metrics on http://%s/metrics\n", addrs.Metrics)
	}
	if s.PreviewDomain != "" {
		fmt.Fprintf(stdout, "hiloop previews on %s://pv-ID.%s/\n", s.PreviewURLScheme(), s.PreviewDomain)
	}
	fmt.Fprintf(stdout, "hiloop %s serving on http://%s (cluster %s, namespace %s)\n", version, addrs.API, a.ClusterHost(), s.Namespace)
	if s.AddrFile != "" {
		if err := writeAddrFile(s.AddrFile, addrs); err != nil {
			a.Close()
			return fmt.Errorf("--addr-file: %w", err)
		}
	}
	return a.Run(ctx)
}

// writeAddrFile writes addrs to path as one JSON object, through a
// temporary file renamed into place, so a reader that finds the file finds
// it whole.
func writeAddrFile(path string, addrs app.Addrs) error {
	raw, err := json.Marshal(addrs)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".hiloop-addrs-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// newLogger is the logger of level and format (text or json) on stderr;
// client-go's own logging goes through it too, at one level less chatty.
func newLogger(levelName, format string) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(levelName))
	handler := func(l slog.Level) slog.Handler {
		if format == "json" {
			return slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})
		}
		return slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})
	}
	klog.SetSlogLogger(slog.New(handler(max(level, slog.LevelWarn))).With("component", "client-go"))
	return slog.New(handler(level))
}

// DevCmd runs hiloop against a local cluster: by default one whose node
// really runs sandboxes under gVisor, where the machine can run it.
type DevCmd struct {
	ClusterBin   string   `required:"" env:"HILOOP_CLUSTER_BIN" help:"Directory of the cluster binaries (printed by testdata/cluster/build.sh)."`
	Node         string   `default:"auto" enum:"auto,real,simulated" env:"HILOOP_DEV_NODE" help:"The node sandboxes run on: real (a kubelet, containerd and gVisor on this machine; needs root), simulated (kwok: sandboxes are simulated and their commands run on this host), or auto (real where this machine can run it)."`
	ImageArchive []string `name:"image-archive" type:"existingfile" help:"An image tarball (docker save, or an OCI layout) the real node can run, besides busybox; repeatable."`
	ServeCmd     `embed:""`

	// attestationSet says the flag or the environment set
	// --runtime-attestation.
	attestationSet bool
}

// BeforeResolve runs after the defaults and environment are read and before
// the command line is. Runtime attestation follows the node unless the
// flag or HILOOP_RUNTIME_ATTESTATION says otherwise: on for the real node,
// off for the simulated one, whose exec commands run on this machine, so an
// attestation would see this host's kernel and quarantine every sandbox.
func (d *DevCmd) BeforeResolve() error {
	_, d.attestationSet = os.LookupEnv("HILOOP_RUNTIME_ATTESTATION")
	return nil
}

// attestation says whether dev attests sandboxes' runtime on its node.
func (d *DevCmd) attestation(realNode bool) bool {
	if d.attestationSet {
		return d.RuntimeAttestation
	}
	return realNode
}

// AfterApply notes a --runtime-attestation given on the command line.
func (d *DevCmd) AfterApply(kctx *kong.Context) error {
	for _, p := range kctx.Path {
		if p.Flag != nil && p.Flag.Name == "runtime-attestation" {
			d.attestationSet = true
		}
	}
	return nil
}

// BeforeApply runs before the flags are validated: dev backs the forward
// transport with its own session helpers (in the pod on the real node, as
// local processes on the simulated one), so --transports may name forward
// without --agent-image.
func (d *DevCmd) BeforeApply() error {
	d.LocalHelpers = true
	return nil
}

// simulatedBanner is what hiloop dev says when its sandboxes are simulated.
const simulatedBanner = "WARNING: sandboxes are simulated: commands run on this host"

// Run starts the cluster, serves against it, and tears it down on exit.
func (d *DevCmd) Run(ctx context.Context, stdout io.Writer) error {
	realNode := d.Node == "real"
	if d.Node == "auto" {
		err := localcluster.RealNodeSupported(d.ClusterBin)
		realNode = err == nil
		if !realNode {
			fmt.Fprintf(stdout, "%s (no real node: %v).\n", simulatedBanner, err)
		}
	} else if !realNode {
		fmt.Fprintf(stdout, "%s (--node simulated).\n", simulatedBanner)
	}
	d.RuntimeAttestation = d.attestation(realNode)
	if !realNode && len(d.ImageArchive) > 0 {
		return errors.New("--image-archive: images run only on the real node (--node real)")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	node := "kwok's simulated node"
	if realNode {
		node = "a real node: kubelet, containerd and gVisor on this machine"
	}
	fmt.Fprintf(stdout, "Starting the local cluster (etcd, kube-apiserver, scheduler, controller-manager, agent-sandbox controller, %s)...\n", node)
	c, err := localcluster.Start(ctx, localcluster.Options{BinDir: d.ClusterBin, Namespace: d.Namespace, Log: os.Stderr,
		RealNode: realNode, HiloopBinary: exe, ImageArchives: d.ImageArchive})
	if c != nil {
		defer c.Stop()
	}
	if err != nil {
		return err
	}
	d.Kubeconfig = c.Kubeconfig
	if d.BoundaryFile == "" {
		// The local cluster installs the chart with values-local.yaml, and
		// its self-check holds it to that rendering.
		if d.Expected, err = boundary.Parse(localcluster.BoundaryYAML()); err != nil {
			return err
		}
	}
	if len(d.StorageClasses) == 0 {
		d.StorageClasses = []string{"kwok-volume"}
	}
	if !slices.Contains(d.Transports, receipt.TransportForward) {
		d.Transports = append(d.Transports, receipt.TransportForward)
	}
	// On the realNode node the session helper runs in each pod, from the image
	// of this very binary; on the simulated one, as local processes of it.
	var helpers func(context.Context, *slog.Logger) error
	if realNode {
		d.AgentImage = c.AgentImage()
	} else {
		if d.AgentImage == "" {
			d.AgentImage = "hiloop-agent:local"
		}
		helpers = func(ctx context.Context, log *slog.Logger) error {
			return localcluster.RunHelpers(ctx, localcluster.HelperOptions{Clients: c.Clients, Binary: exe, Dir: c.Workdir, Log: log})
		}
	}
	fmt.Fprintf(stdout, "Local cluster up. Inspect it with:\n\n    kubectl --kubeconfig %s get sandboxes,pods -n %s\n\n", c.Kubeconfig, c.Namespace)
	tuneGC()
	return d.serve(ctx, stdout, helpers)
}
