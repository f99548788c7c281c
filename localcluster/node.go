package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The real node: a kubelet, containerd 2 and gVisor's runsc on this
// machine, which really runs pods, each pod a gVisor sandbox.
const (
	// RealNodeName is the real node's name.
	RealNodeName = "hiloop-node-0"
	// RealPodCIDR is where the real node's pods get their addresses, on
	// the bridge RealBridge, which the host routes to.
	RealPodCIDR = "10.213.0.0/24"
	// RealBridge is the real node's CNI bridge in the host's network
	// namespace.
	RealBridge = "hiloop0"
	// realNodeIP is the bridge's address, the pods' gateway and the
	// node's address, where its kubelet listens.
	realNodeIP = "10.213.0.1"
	// realCgroup holds every process of the real node (containerd, its
	// shims, runsc's sandboxes, the kubelet) and, as the kubelet's
	// cgroupRoot, every pod's cgroup, in each cgroup v1 hierarchy: the
	// reaper kills what is in it and removes it.
	realCgroup = "hiloop-node"
	// realNodeLock is the machine-wide lock of the real node: one kubelet
	// per machine, since a kubelet writes machine-wide state (sysctls, its
	// cgroup root, the bridge).
	realNodeLock = "hiloop-realnode.lock"
)

// realNodeParts are the binaries the real node runs, and the Python
// image's root, from build.sh.
var realNodeParts = []string{"kubelet", "busybox", "python-rootfs", "containerd", "ctr", "runsc", "containerd-shim-runsc-v1", "bridge", "host-local", "loopback"}

// nodeSysctls are the kernel settings the kubelet and the bridge plugin
// change, restored when the node stops.
var nodeSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward"}

// RealNodeSupported says why this machine cannot run the real node, or
// nil when it can: it needs root, the node's binaries in binDir, and the
// host tools the node's launcher uses.
func RealNodeSupported(binDir string) error {
	if os.Geteuid() != 0 {
		return errors.New("a real node needs root (a kubelet, containerd and gVisor)")
	}
	for _, b := range realNodeParts {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("the real node's %s is missing in %s: run testdata/cluster/build.sh", b, binDir)
		}
	}
	for _, tool := range []string{"unshare", "nsenter", "ip", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("a real node needs %s on PATH", tool)
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids"); err != nil {
		return errors.New("a real node needs the cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
	}
	return nil
}

// lockRealNode takes the machine's real node lock, waiting for another
// cluster's node to stop. The lock is the returned file's; the reaper
// inherits it, so it is held until the node is torn down even when this
// process dies first.
func lockRealNode(ctx context.Context, log func(string)) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), realNodeLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock the real node: %w", err)
		}
		if !said {
			log("waiting for another local cluster's real node to stop (one per machine)")
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the machine's real node: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// NodeDir is where the real node keeps its state, configuration and logs
// ("" without one):
// a directory of its own beside the work directory, which is 0700 and
// holds the cluster's keys, since gVisor's sandbox opens the containers'
// files as an unprivileged user of the host, who must be able to pass
// through to them.
func (c *Cluster) NodeDir() string { return c.node }

// cgroupHierarchies are the cgroup v1 hierarchies the node's cgroup is made
// in: every mounted controller hierarchy, since the kubelet wants its
// cgroupRoot in each.
func cgroupHierarchies() ([]string, error) {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	var hs []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || name == "unified" {
			continue
		}
		hs = append(hs, filepath.Join("/sys/fs/cgroup", name))
	}
	return hs, nil
}

// startRealNode starts containerd and a kubelet in a private mount
// namespace (their mounts, and the state they write under /run, /var/lib
// and /var/log, are the node directory's and vanish with them), with every
// process in realCgroup, and waits for the node to be Ready.
func (c *Cluster) startRealNode(ctx context.Context, o Options) error {
	dir, err := os.MkdirTemp("", "hiloop-node-")
	if err != nil {
		return err
	}
	c.node = dir
	// The reaper tears the node down, and removes the directory, once
	// node.dir names it: written before anything is in it.
	if err := os.WriteFile(filepath.Join(c.Workdir, "node.dir"), []byte(dir), 0o600); err != nil {
		os.RemoveAll(dir)
		return err
	}
	if err := prepareNodeDir(dir); err != nil {
		return err
	}
	if err := makeNodeBridge(); err != nil {
		return err
	}
	hierarchies, err := makeNodeCgroups()
	if err != nil {
		return err
	}

	if o.RuncHandler {
		if _, err := os.Stat(filepath.Join(c.bin, "runc")); err != nil {
			return fmt.Errorf("a runc handler needs runc from testdata/cluster/build.sh: %w", err)
		}
	}
	imgs, err := StartImages(ctx, ImageOptions{BinDir: c.bin, HiloopBinary: o.HiloopBinary, Archives: o.ImageArchives})
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	c.images = imgs
	if err := imgs.WriteHostsDir(filepath.Join(dir, "certs.d")); err != nil {
		return err
	}
	pki := filepath.Join(c.Workdir, "clusters", c.name, "pki")
	files := map[string]string{
		"containerd.toml":              containerdConfig(dir, c.bin, o.RuncHandler),
		"runsc.toml":                   runscConfig(dir, c.bin),
		"cni/net.d/10-hiloop.conflist": cniConfig(dir),
		"kubelet.yaml":                 kubeletConfig(dir, filepath.Join(pki, "ca.crt")),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	logf, err := os.Create(filepath.Join(dir, "node.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", nodeLauncher)
	cmd.Env = append(os.Environ(),
		"NODE_DIR="+dir, "BIN="+c.bin, "CGROUPS="+strings.Join(hierarchies, " "), "CGROUP="+realCgroup,
		"KUBECONFIG_FILE="+c.Kubeconfig, "NODE_NAME="+RealNodeName, "NODE_IP="+realNodeIP, "PATH="+c.bin+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the real node: %w", err)
	}
	go cmd.Wait()
	return c.waitRealNode(ctx, cmd.Process.Pid)
}

// prepareNodeDir makes the node directory's tree, and writes down first
// what the node changes machine-wide, so that the reaper can put it back
// whatever happens next.
func prepareNodeDir(dir string) error {
	for _, d := range []string{"run", "var-lib", "var-log", "cni/net.d", "cni/ipam", "runsc", "runsc-logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	// Traversable, not listable: the path to the containers' files.
	for _, d := range []string{"", "containerd", "containerd/root", "containerd/state", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(dir, d), 0o711); err != nil {
			return err
		}
	}
	var saved strings.Builder
	for _, s := range nodeSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			continue
		}
		fmt.Fprintf(&saved, "%s %s\n", s, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(filepath.Join(dir, "sysctl.saved"), []byte(saved.String()), 0o600)
}

// makeNodeBridge makes the node's bridge, before the kubelet starts: its
// gateway address is the node's address, which the API server reaches the
// kubelet at (a kubelet takes no loopback address as its node's). The CNI
// bridge plugin uses it as it finds it.
func makeNodeBridge() error {
	// A bridge left by a node whose machine went down before its reaper
	// ran (the lock is ours, so no node uses it).
	exec.Command("ip", "link", "del", RealBridge).Run()
	for _, args := range [][]string{
		{"link", "add", "name", RealBridge, "type", "bridge"},
		{"addr", "add", realNodeIP + "/24", "dev", RealBridge},
		{"link", "set", RealBridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("node bridge: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// makeNodeCgroups makes realCgroup in every cgroup hierarchy, and returns
// the hierarchies.
func makeNodeCgroups() ([]string, error) {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	for _, h := range hierarchies {
		if err := os.MkdirAll(filepath.Join(h, realCgroup), 0o755); err != nil {
			return nil, fmt.Errorf("node cgroup: %w", err)
		}
		// A new cpuset cgroup has no CPUs or memory nodes, and takes no
		// process until it has them: the machine's.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(h, realCgroup, f), v, 0o644); err != nil {
					return nil, fmt.Errorf("node cgroup: %s: %w", f, err)
				}
			}
		}
	}
	return hierarchies, nil
}

// waitRealNode waits until the kubelet has registered the node and it is
// Ready, or the launcher has died.
func (c *Cluster) waitRealNode(ctx context.Context, launcher int) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		n, err := c.Clients.Kube.CoreV1().Nodes().Get(ctx, RealNodeName, metav1.GetOptions{})
		if err == nil && nodeReady(n) {
			return nil
		}
		if syscall.Kill(launcher, 0) != nil {
			return fmt.Errorf("the real node stopped while starting:\n%s", c.nodeLogTail())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the real node was not Ready in 2m:\n%s", c.nodeLogTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nodeLogTail is the end of each of the node's logs, for an error that
// must explain itself after the work directory is gone.
func (c *Cluster) nodeLogTail() string {
	var b strings.Builder
	for _, name := range []string{"node.log", "containerd.log", "kubelet.log"} {
		raw, err := os.ReadFile(filepath.Join(c.NodeDir(), name))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		if len(lines) > 12 {
			lines = lines[len(lines)-12:]
		}
		fmt.Fprintf(&b, "%s:\n  %s\n", name, strings.Join(lines, "\n  "))
	}
	return b.String()
}

// nodeLauncher runs in a private mount namespace: it joins the node's
// cgroup, puts the node directory over /run, /var/lib and /var/log (the
// kubelet and containerd write there whatever their configuration says),
// and runs containerd, then the kubelet.
const nodeLauncher = `set -e
for h in $CGROUPS; do echo $$ > "$h/$CGROUP/cgroup.procs"; done
mount --bind "$NODE_DIR/run" /run
mount --bind "$NODE_DIR/var-lib" /var/lib
mount --bind "$NODE_DIR/var-log" /var/log
containerd --config "$NODE_DIR/containerd.toml" >"$NODE_DIR/containerd.log" 2>&1 &
i=0
until [ -S "$NODE_DIR/containerd.sock" ]; do
	i=$((i+1)); [ $i -lt 600 ] || { echo "containerd did not start"; exit 1; }
	sleep 0.1
done
exec kubelet --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$KUBECONFIG_FILE" \
	--root-dir "$NODE_DIR/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
	--node-labels hiloop.dev/node=real >"$NODE_DIR/kubelet.log" 2>&1
`

// nodeReaper is the part of the reaper's script that tears the real node
// down: it kills every process in the node's cgroup until none is left
// (the mount namespace and its mounts go with the last), removes the
// cgroups and the bridge, and restores the sysctls.
const nodeReaper = `if [ -f "$KWOK_WORKDIR/node.dir" ]; then
	node=$(cat "$KWOK_WORKDIR/node.dir")
	for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
		left=0
		for f in $(find /sys/fs/cgroup/pids/` + realCgroup + ` -name cgroup.procs 2>/dev/null); do
			for p in $(cat "$f"); do kill -9 "$p" 2>/dev/null; left=1; done
		done
		[ $left = 0 ] && break
		sleep 0.2
	done
	# A cgroup whose last process has just died can refuse rmdir (EBUSY)
	# for a moment.
	for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
		left=0
		for h in /sys/fs/cgroup/*/; do
			[ -d "${h}` + realCgroup + `" ] || continue
			find "${h}` + realCgroup + `" -noleaf -depth -type d -exec rmdir {} \; 2>/dev/null
			[ -d "${h}` + realCgroup + `" ] && left=1
		done
		[ $left = 0 ] && break
		sleep 0.2
	done
	ip link del ` + RealBridge + ` 2>/dev/null
	[ -f "$node/sysctl.saved" ] && while read -r key value; do echo "$value" > "/proc/sys/$key"; done < "$node/sysctl.saved"
	rm -rf "$node"
fi
`

// containerdConfig runs containerd with its state in dir, gVisor as the
// default and only runtime (a pod of any runtime class runs under runsc:
// this node has no runc) unless runc is asked for (Options.RuncHandler),
// the node's CNI bridge, and the local image mirror for every registry.
func containerdConfig(dir, bin string, runc bool) string {
	extra := ""
	if runc {
		extra = `    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "` + bin + `/runc"
`
	}
	return `version = 3
root = "` + dir + `/containerd/root"
state = "` + dir + `/containerd/state"
[grpc]
  address = "` + dir + `/containerd.sock"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "` + PauseImage + `"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "` + dir + `/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runsc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "` + dir + `/runsc.toml"
` + extra + `  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["` + bin + `"]
    conf_dir = "` + dir + `/cni/net.d"
`
}

// runscConfig is gVisor's shim configuration: runsc from build.sh, the
// systrap platform (KVM is not usable on these machines).
func runscConfig(dir, bin string) string {
	return `binary_name = "` + bin + `/runsc"
root = "` + dir + `/runsc"
[runsc_config]
  platform = "systrap"
  debug-log = "` + dir + `/runsc-logs/"
`
}

// cniConfig is a bridge with the host as gateway (host to pod and pod to
// host both work), addresses from RealPodCIDR, no masquerade (no iptables
// is needed, and pods reach nothing beyond the host).
func cniConfig(dir string) string {
	return `{
  "cniVersion": "1.0.0",
  "name": "hiloop",
  "plugins": [{
    "type": "bridge",
    "bridge": "` + RealBridge + `",
    "isGateway": true,
    "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": "` + dir + `/cni/ipam", "ranges": [[{"subnet": "` + RealPodCIDR + `"}]]}
  }, {"type": "loopback"}]
}
`
}

// kubeletConfig serves the kubelet's API on realNodeIP:10250 (the address
// is the node's own) to clients with
// a certificate of the cluster's CA (the API server's), with cgroupfs on
// these cgroup v1 machines, every pod cgroup under realCgroup, no swap
// check, and eviction and image garbage collection that a developer's
// nearly full disk does not set off.
func kubeletConfig(dir string, clientCA string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ` + realNodeIP + `
port: 10250
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://` + dir + `/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /` + realCgroup + `
failCgroupV1: false
failSwapOn: false
resolvConf: ""
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "` + clientCA + `"}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
`
}

// AgentImage is the session helper's image on the real node (hiloop's
// own binary), or "" on a cluster without one.
func (c *Cluster) AgentImage() string {
	if c.images == nil {
		return ""
	}
	return c.images.AgentImage()
}
