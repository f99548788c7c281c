// Package localcluster starts a real, local Kubernetes control plane for
// `hiloop dev` and for the tests (internal/e2e wraps it): a real etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler run by kwokctl's
// binary runtime, pods faked by kwok on a node whose pod IPs are loopback
// addresses, the agent-sandbox Sandbox CRD at v1beta1, and the upstream
// agent-sandbox controller.
//
// The binaries come from testdata/cluster/build.sh, found through
// $HILOOP_CLUSTER_BIN. What it reads of upstream modules (the Sandbox CRD,
// kwok's stages) is embedded at build time from assets/, made by go
// generate, so it needs no Go toolchain at run time. Every process started
// is ended by Stop, and by a reaper process when the process that started
// the cluster dies without stopping it (even by SIGKILL).
package localcluster

//go:generate go run gen.go

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/hiloop/hiloop/k8s"
)

// Pinned module versions whose files assets/ holds (CRD, kwok stages). They
// match testdata/cluster/versions.env.
const (
	AgentSandboxModule = "sigs.k8s.io/agent-sandbox@v0.5.6"
	KwokModule         = "sigs.k8s.io/kwok@v0.8.0"
)

// What the cluster defines.
const (
	NodeName = "kwok-node-0"
	// RuntimeClass is the gVisor runtime class the cluster defines.
	RuntimeClass = k8s.DefaultRuntimeClass
	// PodCIDRs is where pods get loopback addresses, which a test may
	// listen on: each running cluster on the machine leases one /24 of it
	// (Cluster.PodCIDR), since its helpers (RunHelpers) bind its pods'
	// addresses on the host's one loopback, and two clusters handing out
	// the same address would put one cluster's helper where the other's
	// gateway dials.
	PodCIDRs = "127.0.96.0/20"
)

// sandboxCRD is the agent-sandbox Sandbox CRD at v1beta1 only, without its
// conversion webhook (see gen.go).
//
//go:embed assets/sandbox-crd.yaml
var sandboxCRD []byte

// VolumeDir is where the local cluster's volumes (the hostPath PVs of
// kwok's volume stage) live on a real node: under /var/lib, the node's own
// directory.
const VolumeDir = "/var/lib/hiloop-volumes"

// StageVolumeDir moves the hostPath directories of kwok's volume stage
// from kwok's /tmp/kwok-local-path-provisioner to VolumeDir, and fails if
// the stage no longer names that directory.
func StageVolumeDir(stage []byte) ([]byte, error) {
	const kwokDir = "/tmp/kwok-local-path-provisioner/"
	if !bytes.Contains(stage, []byte(kwokDir)) {
		return nil, fmt.Errorf("kwok's volume stage no longer names %s", kwokDir)
	}
	return bytes.ReplaceAll(stage, []byte(kwokDir), []byte(VolumeDir+"/")), nil
}

// kwokStages are the kwok Stage files the cluster runs (see gen.go).
//
//go:embed assets/kwok-stages.yaml
var kwokStages []byte

// Options configure Start.
type Options struct {
	// BinDir holds the cluster binaries; $HILOOP_CLUSTER_BIN when empty.
	BinDir string
	// Namespace is created for sandboxes; k8s.DefaultNamespace when empty.
	Namespace string
	// Log receives progress lines; discarded when nil.
	Log io.Writer
	// RealNode adds a node that really runs pods under gVisor (a kubelet,
	// containerd and runsc on this machine) and keeps sandboxes off kwok's
	// simulated node. It needs root (RealNodeSupported says what else),
	// and one runs per machine at a time: Start waits for another's to
	// stop.
	RealNode bool
	// HiloopBinary is the static hiloop binary the real node's session
	// helper image is made of; this process's executable when empty.
	HiloopBinary string
	// ImageArchives are image tarballs (docker save, or OCI layout) the
	// real node can run, besides busybox and hiloop's own.
	ImageArchives []string
	// RuncHandler, for tests only, gives the real node a second runtime
	// handler, runc (Debian's, from build.sh): a RuntimeClass whose handler
	// is runc runs pods outside gVisor, on this host's kernel, which is
	// what runtime attestation must catch. hiloop dev never sets it.
	RuncHandler bool
}

// SimulatedTaint keeps sandboxes off kwok's simulated node when the
// cluster has a real one.
const SimulatedTaint = "hiloop.dev/simulated"

// Cluster is a running local cluster.
type Cluster struct {
	// Kubeconfig is the path of an admin kubeconfig for the cluster.
	Kubeconfig string
	// Clients are hiloop's clients for the cluster.
	Clients *k8s.Clients
	// Namespace is the sandbox namespace.
	Namespace string
	// Workdir holds the cluster's state and logs (KWOK_WORKDIR).
	Workdir string
	// PodCIDR is the /24 of PodCIDRs this cluster's pods get their
	// addresses from, leased for the cluster's life: no other cluster on
	// the machine hands them out until Stop.
	PodCIDR string

	// Real says the cluster has a real node (Options.RealNode): its pods
	// run under gVisor on this machine.
	Real bool

	// podLease holds the lock on PodCIDR until Stop.
	podLease *os.File
	// nodeLock holds the machine's real node lock; the reaper shares it,
	// so it outlives this process until the node is torn down.
	nodeLock *os.File
	images   *Images
	// node is the real node's directory (NodeDir).
	node string

	name       string
	bin        string
	controller *exec.Cmd
	reaper     *exec.Cmd
	reaperIn   io.WriteCloser
	stopOnce   sync.Once
	stopErr    error
}

// Start starts a cluster. On error the returned Cluster, when not nil, must
// still be stopped.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.BinDir == "" {
		o.BinDir = os.Getenv("HILOOP_CLUSTER_BIN")
	}
	if o.BinDir == "" {
		return nil, errors.New("HILOOP_CLUSTER_BIN is not set: build the cluster with testdata/cluster/build.sh (make cluster) and point it at the printed directory")
	}
	if o.Namespace == "" {
		o.Namespace = k8s.DefaultNamespace
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwokctl", "agent-sandbox-controller"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("cluster binary %s missing in %s: run testdata/cluster/build.sh", b, o.BinDir)
		}
	}
	start := time.Now()
	var nodeLock *os.File
	if o.RealNode {
		if err := RealNodeSupported(o.BinDir); err != nil {
			return nil, err
		}
		var err error
		if nodeLock, err = lockRealNode(ctx, func(s string) { fmt.Fprintln(o.Log, "localcluster: "+s) }); err != nil {
			return nil, err
		}
		defer nodeLock.Close() // the reaper holds its own copy
	}
	workdir, err := os.MkdirTemp("", "hiloop-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Workdir: workdir, Namespace: o.Namespace, name: "hiloop", bin: o.BinDir,
		Kubeconfig: filepath.Join(workdir, "kubeconfig"), Real: o.RealNode, nodeLock: nodeLock}
	if err := c.startReaper(); err != nil {
		os.RemoveAll(workdir)
		return nil, err
	}
	step := func(what string, fn func() error) error {
		t := time.Now()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		fmt.Fprintf(o.Log, "localcluster: %s (%s)\n", what, time.Since(t).Round(time.Millisecond))
		return nil
	}
	// kwokctl picks its ports by scanning for free ones, so two clusters
	// created at once (test packages run in parallel) pick the same ports.
	// One machine-wide lock, held until the ports are bound, serialises that.
	unlock, err := lockPorts()
	if err != nil {
		return c, err
	}
	if c.PodCIDR, c.podLease, err = leasePodCIDR(os.TempDir()); err != nil {
		unlock()
		return c, err
	}
	err = step("create control plane", func() error { return c.createControlPlane(ctx) })
	if err == nil {
		err = step("prepare cluster", func() error { return c.prepare(ctx) })
	}
	unlock()
	if err == nil {
		err = step("start agent-sandbox controller", c.startController)
	}
	if err == nil && o.RealNode {
		err = step("start the real node (kubelet, containerd, gVisor)", func() error { return c.startRealNode(ctx, o) })
	}
	if err != nil {
		return c, err
	}
	fmt.Fprintf(o.Log, "localcluster: cluster up in %s, KWOK_WORKDIR=%s\n", time.Since(start).Round(time.Millisecond), workdir)
	return c, nil
}

// lockPorts takes the machine-wide lock on cluster creation.
func lockPorts() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "hiloop-localcluster.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock cluster creation: %w", err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// leasePodCIDR takes the first /24 of PodCIDRs no other cluster on the
// machine holds: a lock file per block in dir, held until the returned
// file is closed (or the process ends, so a crashed test frees its block).
func leasePodCIDR(dir string) (string, *os.File, error) {
	all := netip.MustParsePrefix(PodCIDRs)
	base := all.Addr().As4()
	for i := range 1 << (24 - all.Bits()) {
		block := netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1], base[2] + byte(i), 0}), 24)
		f, err := os.OpenFile(filepath.Join(dir, "hiloop-localcluster-pods-"+block.Addr().String()+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return "", nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue
			}
			return "", nil, fmt.Errorf("lease pod addresses %s: %w", block, err)
		}
		return block.String(), f, nil
	}
	return "", nil, fmt.Errorf("every /24 of %s is leased by another local cluster on this machine", PodCIDRs)
}

func (c *Cluster) env() []string {
	return append(os.Environ(), "KWOK_WORKDIR="+c.Workdir)
}

// startReaper starts a detached shell that waits for its stdin to close,
// which happens when this process exits for any reason, and then tears the
// cluster down. Stop closes stdin itself and waits for it.
func (c *Cluster) startReaper() error {
	script := `read _ignored
kill -9 $(cat "$KWOK_WORKDIR/controller.pid" 2>/dev/null) 2>/dev/null
` + nodeReaper + `"$KWOKCTL" delete cluster --name "$CLUSTER" >"$KWOK_WORKDIR/reaper.log" 2>&1
# Any component kwokctl could not stop still holds a pid file.
for f in "$KWOK_WORKDIR"/clusters/*/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
rm -rf "$KWOK_WORKDIR"
`
	cmd := exec.Command("/bin/sh", "-c", script)
	// The reaper holds the real node's lock (its fd 3) until it has torn
	// the node down and exits.
	if c.nodeLock != nil {
		cmd.ExtraFiles = []*os.File{c.nodeLock}
	}
	cmd.Env = append(c.env(), "KWOKCTL="+filepath.Join(c.bin, "kwokctl"), "CLUSTER="+c.name)
	// Its own session: a Ctrl-C to the test's process group must not kill the
	// reaper before it has reaped.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start reaper: %w", err)
	}
	c.reaper, c.reaperIn = cmd, in
	return nil
}

// kwokConfig runs the control plane as local processes. The API server
// shows the kubelets its admin certificate (the real node's kubelet takes
// clients of the cluster's CA) and reaches them at their nodes' addresses
// (no name of the real node resolves), and kwok simulates only the node made for
// it, never the real one. The scheduler and
// the controller manager run without leader election: with it they exit
// ("leaderelection lost") after an API server stall of about 30 s, and
// nothing restarts them, so every later sandbox would stay starting.
const kwokConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  disableQPSLimits: true
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - key: kubelet-client-certificate
    value: PKI_DIR/admin.crt
  - key: kubelet-client-key
    value: PKI_DIR/admin.key
  - key: kubelet-preferred-address-types
    value: InternalIP,Hostname
- name: kwok-controller
  extraArgs:
  - key: manage-all-nodes
    value: "false"
  - key: manage-nodes-with-annotation-selector
    value: kwok.x-k8s.io/node=fake
- name: kube-scheduler
  extraArgs:
  - key: leader-elect
    value: "false"
- name: kube-controller-manager
  extraArgs:
  - key: leader-elect
    value: "false"
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: no-tar
spec:
  selector:
    matchNamespaces: [` + NoTarNamespace + `]
  execs:
  - local:
      envs:
      - name: PATH
        value: NO_TAR_PATH
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: local
spec:
  execs:
  - local: {}
`

// NoTarNamespace is a sandbox namespace whose pods stand for an image
// without tar. Pods never run images here, so exec commands run on this
// machine; there they run with a PATH that holds sh and the usual
// utilities but no tar (noTarTools). The namespace is not made until
// AddSandboxNamespace makes it.
const NoTarNamespace = "hiloop-no-tar"

// noTarTools are what an image without tar offers.
var noTarTools = []string{"sh", "cat", "chmod", "echo", "head", "ls", "mkdir", "mv", "rm", "sleep", "true", "false"}

// noTarPath makes the directory of noTarTools, linked to this machine's.
func (c *Cluster) noTarPath() (string, error) {
	dir := filepath.Join(c.Workdir, "no-tar-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, tool := range noTarTools {
		full, err := exec.LookPath(tool)
		if err != nil {
			continue
		}
		if err := os.Symlink(full, filepath.Join(dir, tool)); err != nil && !os.IsExist(err) {
			return "", err
		}
	}
	return dir, nil
}

func (c *Cluster) createControlPlane(ctx context.Context) error {
	noTar, err := c.noTarPath()
	if err != nil {
		return err
	}
	config := strings.NewReplacer("NO_TAR_PATH", noTar, "PKI_DIR", filepath.Join(c.Workdir, "clusters", c.name, "pki")).Replace(kwokConfig) + "---\n" + string(kwokStages)
	configPath := filepath.Join(c.Workdir, "kwok.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return err
	}
	b := func(name string) string { return filepath.Join(c.bin, name) }
	cmd := exec.CommandContext(ctx, b("kwokctl"), "-c", configPath, "create", "cluster", "--name", c.name,
		"--runtime", "binary",
		"--etcd-binary", b("etcd"),
		"--kube-apiserver-binary", b("kube-apiserver"),
		"--kube-controller-manager-binary", b("kube-controller-manager"),
		"--kube-scheduler-binary", b("kube-scheduler"),
		"--kwok-controller-binary", b("kwok"),
		"--kubeconfig", c.Kubeconfig,
		"--wait", "90s")
	cmd.Env = c.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kwokctl create cluster: %w\n%s", err, out)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	// The certificates inline: with file paths client-go starts a reloader
	// that runs for the life of the process.
	if err := rest.LoadTLSFiles(cfg); err != nil {
		return err
	}
	c.Clients, err = k8s.NewClients(cfg)
	return err
}

// prepare makes the fake node and a default storage class that kwok
// provisions, and installs the Sandbox CRD and the chart's isolation
// boundary (with the sandbox namespace and the gVisor RuntimeClass, which
// kwok's simulated node accepts like any other).
func (c *Cluster) prepare(ctx context.Context) error {
	// 20,000 pods, each with the RuntimeClass's overhead of 100m CPU and
	// 64Mi, and room to spare: the node must not be what stops a scale
	// benchmark.
	nodeResources := corev1.ResourceList{"cpu": resource.MustParse("4000"), "memory": resource.MustParse("4Ti"), "pods": resource.MustParse("20000")}
	kube := c.Clients.Kube
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: NodeName,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": NodeName}},
		Spec: corev1.NodeSpec{PodCIDR: c.PodCIDR, PodCIDRs: []string{c.PodCIDR}},
		Status: corev1.NodeStatus{
			Allocatable: nodeResources,
			Capacity:    nodeResources,
			Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: "localhost"}},
		},
	}
	if c.Real {
		node.Spec.Taints = []corev1.Taint{{Key: SimulatedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	if _, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	// A Ready node means kwok runs (and holds its ports).
	for {
		n, err := kube.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err == nil && nodeReady(n) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node not ready: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "kwok-volume", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       "kwok.x-k8s.io/volume",
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
	if _, err := kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("storage class: %w", err)
	}
	if err := InstallCRD(ctx, c.Clients); err != nil {
		return err
	}
	if err := c.restartControllerManager(ctx); err != nil {
		return err
	}
	return c.InstallBoundary(ctx)
}

// restartControllerManager restarts kube-controller-manager with its own
// command line once the Sandbox CRD is served. Its quota controller
// discovers resources at start and then only every 30 s, and until it has
// counted Sandboxes the API server refuses every Sandbox create in a
// namespace with a quota ("status unknown for quota"). The command line is
// the one kwokctl saved in its kwok.yaml, so a controller manager that
// already exited (it gives up when the API server is slow to answer on a
// loaded machine) is started all the same.
func (c *Cluster) restartControllerManager(ctx context.Context) error {
	dir := filepath.Join(c.Workdir, "clusters", c.name)
	args, err := componentCommand(filepath.Join(dir, "kwok.yaml"), "kube-controller-manager")
	if err != nil {
		return err
	}
	pidFile := filepath.Join(dir, "pids", "kube-controller-manager.pid")
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(raw)), &pid); err != nil || pid <= 0 {
		return fmt.Errorf("bad pid file %q", raw)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	for gone := false; !gone; {
		// Gone, or a zombie nobody reaps: either way it holds no port.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		gone = err != nil || strings.Contains(string(stat), ") Z ")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, "logs", "kube-controller-manager.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait() // reaps it when the reaper or Stop kills it
	return os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// componentCommand reads the command line kwokctl runs a component with
// (its binary, then its args) from the cluster's saved configuration.
func componentCommand(kwokYAML, name string) ([]string, error) {
	raw, err := os.ReadFile(kwokYAML)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Components []struct {
			Name   string   `json:"name"`
			Binary string   `json:"binary"`
			Args   []string `json:"args"`
		} `json:"components"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", kwokYAML, err)
	}
	for _, comp := range cfg.Components {
		if comp.Name == name && comp.Binary != "" {
			return append([]string{comp.Binary}, comp.Args...), nil
		}
	}
	return nil, fmt.Errorf("%s names no %s", kwokYAML, name)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// InstallCRD installs the embedded Sandbox CRD and waits until it is
// served.
func InstallCRD(ctx context.Context, clients *k8s.Clients) error {
	var crd unstructured.Unstructured
	if err := yaml.Unmarshal(sandboxCRD, &crd.Object); err != nil {
		return fmt.Errorf("sandbox crd: %w", err)
	}
	dyn, err := dynamic.NewForConfig(clients.Config)
	if err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(gvr).Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox crd: %w", err)
	}
	for {
		if err := clients.CheckSandboxAPI(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox crd not served: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TrimCRD keeps only the v1beta1 version of the upstream Sandbox CRD, served
// and stored, and drops its conversion webhook, which the local cluster does
// not run.
func TrimCRD(raw []byte) ([]byte, error) {
	var crd unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		return nil, fmt.Errorf("sandbox crd: %w", err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	var keep []any
	for _, v := range versions {
		m := v.(map[string]any)
		if m["name"] == k8s.SandboxVersion {
			m["served"], m["storage"] = true, true
			keep = append(keep, m)
		}
	}
	if len(keep) != 1 {
		return nil, fmt.Errorf("sandbox crd: no %s version", k8s.SandboxVersion)
	}
	if err := unstructured.SetNestedSlice(crd.Object, keep, "spec", "versions"); err != nil {
		return nil, err
	}
	unstructured.RemoveNestedField(crd.Object, "spec", "conversion")
	return yaml.Marshal(crd.Object)
}

// KwokStageFiles are the kwok Stage files, relative to the kwok module, that
// the cluster runs: kwokctl's defaults for nodes and pods, plus fake volume
// provisioning. Listing any stage replaces kwokctl's defaults, so the
// defaults are listed too.
//
// The volume stage's hostPath directories move from kwok's
// /tmp/kwok-local-path-provisioner to VolumeDir (StageVolumeDir): where a
// real node makes them, /var/lib is its own directory (node.go), torn down
// with it, while /tmp would be this host's and outlive the cluster.
var KwokStageFiles = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat/node-heartbeat.yaml",
	"kustomize/stage/pod/fast/pod-ready.yaml",
	"kustomize/stage/pod/fast/pod-complete.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
	"kustomize/stage/volume/fast/pvc-provision.yaml",
	"kustomize/stage/volume/fast/pv-bind.yaml",
	"kustomize/stage/volume/fast/pvc-delete.yaml",
	"kustomize/stage/volume/fast/pv-delete.yaml",
}

func (c *Cluster) startController() error {
	logf, err := os.Create(filepath.Join(c.Workdir, "agent-sandbox-controller.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.bin, "agent-sandbox-controller"),
		"--enable-webhook=false", "--leader-elect=false", "--kubeconfig", c.Kubeconfig,
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = logf, logf
	// The controller dies with this process even before the reaper runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	c.controller = cmd
	return os.WriteFile(filepath.Join(c.Workdir, "controller.pid"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o600)
}

// Stop tears the cluster down and removes its work directory. It is safe to
// call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		if c.images != nil {
			defer c.images.Close()
		}
		if c.controller != nil {
			c.controller.Process.Kill()
			c.controller.Wait()
		}
		// Closing the reaper's stdin makes it delete the cluster.
		c.reaperIn.Close()
		done := make(chan error, 1)
		go func() { done <- c.reaper.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				c.stopErr = fmt.Errorf("reaper: %w", err)
			}
		case <-time.After(2 * time.Minute):
			c.reaper.Process.Kill()
			c.stopErr = errors.New("reaper did not finish in 2m")
		}
		// The pods' addresses are free for another cluster once this one's
		// pods are gone with it.
		if c.podLease != nil {
			c.podLease.Close()
		}
	})
	return c.stopErr
}

// Pause stops one control-plane component ("etcd", "kube-apiserver", ...)
// with SIGSTOP, as a hung process; resume sends SIGCONT. It is how the tests
// and the outage soak stall the cluster.
func (c *Cluster) Pause(component string) (resume func() error, err error) {
	pid, err := c.PID(component)
	if err != nil {
		return nil, fmt.Errorf("pause %s: %w", component, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("pause %s: %w", component, err)
	}
	return func() error { return syscall.Kill(pid, syscall.SIGCONT) }, nil
}

// PID is the process id of one control-plane component ("etcd",
// "kube-apiserver", "kwok-controller", ...), from kwokctl's pid file.
// Exec commands run as children of kwok-controller: a test tells its own
// cluster's commands from another's on the same machine by that parent.
func (c *Cluster) PID(component string) (int, error) {
	raw, err := os.ReadFile(filepath.Join(c.Workdir, "clusters", c.name, "pids", component+".pid"))
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(raw)), &pid); err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %q", raw)
	}
	return pid, nil
}

// Kubectl runs kubectl against the cluster and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
